"""msrun as the launcher: its four callbacks as the agent's hands (:mod:`.hands`), what is left
of its children when it leaves (:mod:`.children`), and what ``ms_recover.init()`` does in the
MindSpore scheduler process msrun starts (:mod:`.sched_process`)."""
