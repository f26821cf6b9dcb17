"""MindCluster TaskD on ms_recover: the agent msrun hands its workers to (:mod:`.agent`) and the
manager API of MindCluster's ``manager.py`` (:mod:`.manager_api`). The ``taskd.api`` names users
import live in the shim (:mod:`ms_recover.integrations.shims`)."""
