"""Did a restarted job really continue from its checkpoint? (issue 36, verified resume)

After a restore put back step S (CheckpointKeeper.restored_step), the first step the job
prints is compared with S: a job that silently started over (its script ignores
$MGPU_CHECKPOINT_DIR, loads the wrong folder, or a resume bug) is flagged at its first step
line, `resume regression: saved 300, restarted at 0`, instead of the run quietly redoing its
work. A step line is any line with `step N` (`step 310 loss 0.12`, `resumed from step 300`,
`global_step=310`); lines of the fabric gate and of the tool itself are not the job's.
"""

from __future__ import annotations

import re
from collections.abc import Callable

STEP_LINE = re.compile(r"(?:^|[^A-Za-z_])(?:global_)?step[ =:]+(\d{1,15})(?!\d)", re.I)
NOT_THE_JOBS = ("[mgpu-cloud]", "MGPU-", "checkpoint saved")


def step_in(line: str) -> int | None:
    """The step a line of the job's output names, if any."""
    if any(mark in line for mark in NOT_THE_JOBS):
        return None
    found = STEP_LINE.search(line)
    return int(found.group(1)) if found else None


class ResumeCheck:
    """Fed the job's output lines of one attempt; `flag` hears once when its first step line
    is below the saved step. `saved` None: nothing was restored, nothing to check."""

    def __init__(self, saved: int | None, flag: Callable[[str], None]) -> None:
        self.saved, self.flag = saved, flag
        self.first: int | None = None
        self.regressed = False

    def feed(self, line: str) -> None:
        if self.saved is None or self.first is not None:
            return
        step = step_in(line)
        if step is None:
            return
        self.first = step
        if step < self.saved:
            self.regressed = True
            self.flag(f"resume regression: saved {self.saved}, restarted at {step} (the "
                      "job did not load its checkpoint: its work since then is redone)")
