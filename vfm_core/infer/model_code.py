"""The model logged from code for a registered DiT (MLflow "models from code": this file is
copied into the model folder and run at load time; nothing is unpickled)."""

import mlflow.models

from vfm_core.infer.pyfunc import VideoModel

mlflow.models.set_model(VideoModel())
