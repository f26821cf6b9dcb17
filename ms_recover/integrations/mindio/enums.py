"""MindIO TTP's enums with MindIO's values (MindSpore compares their ``.value``)."""

from __future__ import annotations

import enum


class ReportState(enum.Enum):
    """What the training thread reports through ``tft_report_error``."""

    RS_NORMAL = 0
    RS_RETRY = 1
    RS_UCE = 2
    RS_UCE_CORRUPTED = 3
    RS_HCCL_FAILED = 4
    RS_INIT_FINISH = 5
    RS_PREREPAIR_FINISH = 6
    RS_STEP_FINISH = 7
    RS_UNKNOWN = 8


class RepairType(enum.Enum):
    """``repair_info["repair_type"]`` passed to the repair handler."""

    RT_SEND = 0
    RT_UCE_HIGHLEVEL = 1
    RT_UCE_LOWLEVEL = 2
    RT_RECV_REPAIR = 3
    RT_ROLLBACK = 4
    RT_LOAD_CKPT = 5
    RT_LOAD_REBUILD = 6


class Action(enum.Enum):
    """What ``tft_wait_next_action`` returns (as its ``.value``)."""

    RETRY = 0
    EXIT = 1


#: ``tft_get_repair_type()`` answers; "unknow" is MindIO's spelling.
REPAIR_TYPES = ("retry", "recover", "dump", "unknow")
