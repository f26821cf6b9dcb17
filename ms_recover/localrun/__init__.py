"""A whole job on one machine, as ``ms-recover demo`` and ``ms-recover bench`` run it.

* :mod:`.job`: :class:`~ms_recover.localrun.job.LocalJob` (the manager in a thread plus one pod
  per node) and ``ManagerPodJob`` (the manager a process of node 0's pod);
* :mod:`.pods`: local stand-ins for Kubernetes pods, one agent process each, recreated on 86;
* :mod:`.msrunjob`: the same with real ``msrun`` nodes and the taskd shim;
* :mod:`.numpy_trainer`: a MindSpore-free rank program (bit-identical runs);
* :mod:`.worlds`: the world schedule an elastic run's reference run replays;
* :mod:`.faults`: fault plans (``MS_RECOVER_FAULTS``) and the hooks that fire them;
* :mod:`.wait`: waiting on a condition with a deadline.

Everything binds 127.0.0.1 on ephemeral ports. Helpers only the repository's tests use live in
its ``tests/kit/``, outside the package.
"""
