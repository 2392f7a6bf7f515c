"""Checkpoints of a training run, below the packages that write and read them (train, infer,
registry):

    manager.py        CheckpointManager: DCP save / load under any layout, choose the newest
                      intact checkpoint, keep N (the layout of a checkpoint folder is described
                      there)
    trainer_state.py  save_trainer / load_trainer: a trainer's state into and out of a checkpoint
    state_tree.py     a Stateful state as JSON skeleton + flat tensors
    integrity.py      manifest.json: size and sha256 of every file, written last, verified
    layout.py         the names a checkpoint folder's readers share (state.json)
    failures.py       how a failed save or load is told in one line
    errors.py         CheckpointError
    uri.py            models:/NAME@ALIAS | models:/NAME/VERSION -> a local run directory
    serving.py        a registered version's pyfunc input and output: columns, signature, example
    read.py           a checkpoint read without a trainer: where, tensor shapes, tensors
    load.py           a checkpoint of either family loaded for inference (load_dit)
    init.py           a new run started from a trained model (train.init, vfm train --init)
    merge.py          a LoRA / partly frozen run as one plain model (vfm checkpoint merge)
"""
