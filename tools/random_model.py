"""Random-weight MLX model folders of real shapes, for speed runs where weights don't matter
(tests/random_weights.py; its --help says more).

    python tools/random_model.py llama3-8b /tmp/llama3-8b [--dtype bfloat16] [--quiet-after 4 --quiet-scale 0.01]
"""

from random_weights import main

if __name__ == "__main__":
    main()
