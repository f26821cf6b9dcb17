"""Observability: what the manager records and how people read it.

* :mod:`.schema`: the typed record of every kind of event line, its envelope and the codec
  (the manager and every reader import it; it imports the standard library only);
* :mod:`.events`: the manager's JSONL event log (every decision, member and recovery);
* :mod:`.timeline`: a recovery's phases, printed as the demo shows them;
* :mod:`.report`: ``ms-recover report``, timelines and plots from an event log;
* :mod:`.metrics`: Prometheus metrics of a running manager;
* :mod:`.status`: ``ms-recover status``, a running manager's state.
"""
