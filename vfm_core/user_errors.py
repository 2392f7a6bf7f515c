"""The exceptions that carry a message written for the user (a bad input, named, with the
problem): entry points print them as one line, ``error: ...``, and exit 2; anything else is a bug
and keeps its traceback. One list, shared by ``vfm`` and the training entry point."""

from __future__ import annotations


def user_error_types() -> tuple[type[BaseException], ...]:
    from vfm_core.annotate.text_encoder import TextEncoderError
    from vfm_core.config import ConfigError
    from vfm_core.data.index import DatasetIndexError
    from vfm_core.data.shard_reader import ShardError
    from vfm_core.infer.shapes import GenerateError
    from vfm_core.models.layers import ShapeError
    from vfm_core.search.errors import SearchError
    from vfm_core.storage import StorageError
    from vfm_core.train.errors import CheckpointError, TrainingDiverged

    return (ConfigError, ShapeError, CheckpointError, TrainingDiverged, GenerateError,
            DatasetIndexError, StorageError, SearchError, ShardError, TextEncoderError)  # fmt: skip
