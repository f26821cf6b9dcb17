"""Scheduler integration: how the job's manager comes to life next to MindSpore's scheduler.

* :mod:`.hooks`: ``ms-recover hook start|stop|status|install-pth``, called from a
  job's ``train_start.sh`` (``scheduler_hooks/ms_recover_hook.sh``);
* :mod:`.autostart`: the ``.pth`` path, where the MindSpore scheduler process starts the
  manager itself;
* :mod:`.api`: MindCluster's TaskD manager API (``init_taskd_manager`` /
  ``start_taskd_manager``) on our manager.
"""
