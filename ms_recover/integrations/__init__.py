"""ms_recover inside the MindCluster / MindSpore launchers, in one place.

* :mod:`.taskd`: MindCluster TaskD: the agent msrun hands its workers to, and the manager API;
* :mod:`.msrun`: msrun as the launcher (its callbacks as the agent's hands, its children, the
  MindSpore scheduler process);
* :mod:`.mindio`: MindIO-TTP-compatible processor and controller on the manager (MindSpore's
  own fault tolerance, ``TrainFaultTolerance``);
* :mod:`.hook`: the manager started next to MindSpore's scheduler (``ms-recover hook``, the
  ``.pth`` autostart, ``ms_recover_hook.sh``);
* :mod:`.shims`: the opt-in top-level ``taskd`` and ``mindio_ttp`` packages users import
  (``ms-recover shim-path``, :mod:`.shimpath`).
"""
