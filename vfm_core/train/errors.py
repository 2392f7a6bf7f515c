"""Errors a training run reports to the user in one line (the entry point turns them into exit
code 2)."""


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or does not fit the model being trained."""


class TrainingDiverged(RuntimeError):
    """Loss or gradient norm became NaN/inf; raised before the optimizer touches the weights."""
