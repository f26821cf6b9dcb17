"""MindIO TTP, served by ms_recover (opt-in: ``ms-recover shim-path`` first on PYTHONPATH).

``framework_ttp`` and ``controller_ttp`` have the names MindSpore 2.10 calls, with MindIO's
signatures and enum values; the processor behind them is an ms_recover worker link and the
controller is the ms_recover manager (see :mod:`ms_recover.integrations.mindio`).
"""

PROVIDER = "ms_recover"
