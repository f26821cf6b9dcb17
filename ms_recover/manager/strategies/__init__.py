"""Recovery strategies as plug-ins: one module per strategy behind
:class:`~ms_recover.manager.strategies.base.RecoveryStrategy`, registered in
:mod:`~ms_recover.manager.strategies.registry`. Pure: no zmq, numpy or msgpack.
"""
