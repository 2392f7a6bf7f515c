"""The names a checkpoint folder's readers share: ``state.json`` (:data:`STATE_FILE`, the
non-tensor state) and the version of its format; the whole layout of a checkpoint is described in
:mod:`vfm_core.checkpoints.manager`, the manifest in :mod:`vfm_core.checkpoints.integrity`."""

from __future__ import annotations

STATE_FILE = "state.json"
FORMAT_VERSION = 1
