"""Launcher of the recovery benchmark's checkpoint-restart baseline.

The rank program is :mod:`ms_recover.mindspore.programs.ckpt_train`. This launcher notes the
time of the first line of Python, then imports the program (which imports MindSpore), so the
benchmark's "import mindspore" phase is measured as before.

    python -m ms_recover.bench.ckpt_train --steps 100000 --out OUT --ckpt-dir CKPT
"""

from __future__ import annotations

import time

T_START = time.time()  # first line of Python, before any heavy import


def main(argv: list[str] | None = None) -> int:
    from ms_recover.mindspore.programs import ckpt_train  # imports MindSpore

    return ckpt_train.main(argv, started=T_START)


if __name__ == "__main__":
    raise SystemExit(main())
