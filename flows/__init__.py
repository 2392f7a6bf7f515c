"""The Prefect layer's flows. Importing the package readies Prefect to run a flow without a
server (``python -m flows.curate ...``): ``$PREFECT_HOME`` created, a start-up timeout that a busy
machine meets (:func:`vfm_core.infra_env.prefect_without_server`), and the library's log lines
(progress of long steps) sent to the run log (:func:`vfm_core.infra_env.prefect_logs_library`).
It runs here, not in each flow's ``__main__``, because Prefect reads its settings when it is first
imported, which a flow module does before its ``__main__`` block."""

from vfm_core.infra_env import prefect_logs_library, prefect_without_server

prefect_without_server()
prefect_logs_library()
