"""MindIO-TTP-compatible processor and controller backed by the ms_recover manager.

MindSpore's own fault tolerance (``TftHandle``, ``TrainFaultTolerance`` and the TFT loop around
``Model.train``) calls ``mindio_ttp.framework_ttp`` and ``mindio_ttp.controller_ttp``. The
opt-in shim package ``ms_recover/integrations/shims/mindio_ttp`` (first on ``PYTHONPATH`` through
``ms-recover shim-path``) exposes those names; the behaviour lives here: :mod:`.enums` (MindIO's
values), :mod:`.processor` (a worker link per rank that calls MindSpore's registered handlers
in MindIO's order) and :mod:`.controller` (the manager, for MindSpore's stub mode).
Nothing here imports MindSpore.
"""
