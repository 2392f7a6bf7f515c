"""Starting an entry point's ranks and stopping them, below the packages whose entry points they
are (train, infer):

    launcher.py   the one torchrun launch: the command line up to the entry point
                  (torchrun_prefix), ranks started and waited for (run_launch), stop signals
                  passed on (forward_stop_signals), LaunchError; generation's ranks
                  (launch_generation); training's own steps are vfm_core.train.launch
    torchrun.py   ``python -m vfm_core.launch.torchrun``: torchrun, a stop signal ending it in
                  one line
    preempt.py    SIGTERM / SIGUSR1 -> every rank finishes its step, saves and exits 128+signal
                  (StopRequest, Preempted)
"""
