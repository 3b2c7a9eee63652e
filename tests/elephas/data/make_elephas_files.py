"""Writes the Elephas-saved files the tests load. Run with Elephas 7.3 installed (its own venv:
elephas==7.3.0, tensorflow-cpu<2.20, numpy<2, pyspark<=4.0, h5py), from this folder:

    python make_elephas_files.py

Elephas is not a dependency of sparkdl_train; the files are checked in (a few KB each).
"""

import numpy as np
from elephas.ml_model import ElephasEstimator, ElephasTransformer
from elephas.spark_model import AsynchronousSparkModel, SparkModel
from elephas.utils.model_utils import ModelType
from tensorflow import keras

keras.utils.set_random_seed(7)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3, activation="softmax")])
model.compile(keras.optimizers.SGD(learning_rate=0.05), "categorical_crossentropy", metrics=["acc"])
SparkModel(model, num_workers=2, batch_size=16).save("elephas_sync.h5", overwrite=True)
AsynchronousSparkModel(model, mode="hogwild", frequency="batch", num_workers=2).save("elephas_async.h5", overwrite=True)

probe = np.linspace(-1, 1, 20, dtype="float32").reshape(5, 4)
np.save("elephas_probe.npy", probe)
np.save("elephas_probe_out.npy", model.predict(probe, verbose=0))

transformer = ElephasTransformer(weights=model.get_weights(), model_type=ModelType.CLASSIFICATION,
                                 outputCol="probabilities")
transformer.set_keras_model_config(model.to_json())
transformer.save("elephas_transformer.h5")

estimator = ElephasEstimator()
estimator.set_keras_model_config(model.to_json())
estimator.set_loss("categorical_crossentropy")
estimator.set_mode("hogwild")
estimator.set_epochs(3)
estimator.set_nb_classes(3)
estimator.save("elephas_estimator.h5")
