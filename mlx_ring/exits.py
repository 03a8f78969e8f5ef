"""How a rank's process ends, as the launcher reads it: the exit code of each way a rank ends, the
line that says a rank (or the launcher's own start-up) cannot start, and the line that says its GPU
failed. The ranks and the launcher import these; the supervisor decides on them
(`launcher/supervisor.py`: `ON_EXIT`, `must_stop`)."""

import re

# A rank's exit codes, as mlx.launch reports them ("Node with rank N exited with code C"; a rank it
# stopped itself "was killed"; one that exited SHUT_DOWN it does not name).
SHUT_DOWN = 0  # the ring shut down (its SHUTDOWN step), or a worker on a SIGTERM left a silent peer
CRASHED = 1  # Python's own, for an exception nothing caught: a bug, or a tensor worker's RankLeft
REFUSED = 2  # cannot start (a setting, a model, a host that differs), said in a refusal line
HTTP_LOST = 69  # EX_UNAVAILABLE: rank 0's HTTP process died (api/process.py): it serves no one
DEVICE_FAILED = 71  # EX_OSERR: its GPU failed a step (Metal, CUDA), said in a GPU failure line
RING_BROKEN = 75  # EX_TEMPFAIL: the ring broke under the rank (a peer left, a step went unanswered)
SSH_ENDED = 255  # ssh's, not the rank's: a remote rank's session was cut, or it died by a signal
# the launcher's words for a rank that exited with these (after its code)
CAUSES = {DEVICE_FAILED: "its GPU failed", HTTP_LOST: "its HTTP process died"}

MARKER = "cannot start: "  # what the launcher finds a refusal by, wherever a line carries it


def refusal(reason: str) -> str:
    """The line that says this process cannot start, and why: the launcher does not retry it."""
    return f"{MARKER}{reason}"


def refusals(text: str) -> list[str]:
    """Every refusal in `text` (the ranks' output, a log), in order, from its marker on: a line's
    prefix (a rank's log format: time, rank, host) is dropped."""
    return [line[line.index(MARKER) :] for line in text.splitlines() if MARKER in line]


GPU_MARKER = "the GPU failed on rank "
GPU_LINE = re.compile(re.escape(GPU_MARKER) + r"(\d+): (.*)")


def gpu_failure(rank: int, message: str) -> str:
    """The line that says rank `rank`'s GPU failed a step, in MLX's words (`message`), alone on
    its line (after a log's prefix); the rank then exits DEVICE_FAILED."""
    return f"{GPU_MARKER}{rank}: {message}"


def gpu_failures(text: str) -> dict[int, str]:
    """Each rank's first GPU failure in `text` (the ranks' output): {rank: MLX's words}. A
    rank's first line is its own (`gpu_failure`); later ones may quote it with more after."""
    found: dict[int, str] = {}
    for line in text.splitlines():
        if m := GPU_LINE.search(line):
            found.setdefault(int(m.group(1)), m.group(2))
    return found
