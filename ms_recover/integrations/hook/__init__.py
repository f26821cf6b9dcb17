"""The manager next to MindSpore's scheduler: ``ms-recover hook`` (:mod:`.command`), the opt-in
``.pth`` autostart (:mod:`.autostart`), the shell hook ``ms_recover_hook.sh`` a start script
sources, and ``ms-recover hook-path`` (:mod:`.path`), which prints where it is."""
