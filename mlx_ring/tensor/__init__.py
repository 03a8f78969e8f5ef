"""Tensor mode, in one place: every rank holds a share of every layer and runs every step at once,
the layers' all_sums joining the shares. `cut.py` cuts a model into a rank's share (with the layers
of `layers.py`), `shares.py` is the same arithmetic from a config alone (for the planner), `sums.py`
the group and the function the all_sums run over, `lockstep.py` rank 0's handle and the workers'
watch. The steps travel on the ring's control link (ring/control.py).
"""
