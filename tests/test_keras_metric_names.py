"""Every metric name and class the installed Keras 3 exports, beside real Keras 3 (torch backend):
each name gives Keras' value under the name given (unweighted, and in `weighted_metrics` with
`(N, 1)` sample weights), or is refused with what to pass instead; each `keras.metrics` object
gives Keras' value under its own name. A name or class a new Keras adds fails
`test_every_keras_metric_name_and_class_is_covered` until it is placed here."""

import inspect

import numpy as np
import pytest
import torch
from keras_real import keras_weights, real_keras, twin_dense

from fitkit import Model
from fitkit.adapters.keras_metrics import KERAS_MEANS, KERAS_REFUSED
from fitkit.adapters.metric_specs import ALIASES, NAMES, check_metrics

N, BATCH = 32, 8
NOT_METRICS = {"get", "serialize", "deserialize"}  # keras.metrics' lookup helpers
# Names fitkit computes with torchmetrics (same values; fitkit's own names)
FITKIT_NAMES = {"accuracy", "acc", "Accuracy", "mae", "MAE", "mse", "MSE", "precision", "recall", "auc", "AUC",
                "binary_accuracy", "categorical_accuracy", "sparse_categorical_accuracy", "top_k_categorical_accuracy",
                "mean_absolute_error", "mean_squared_error"}


def _keras_names(keras):
    from keras.src.metrics import ALL_OBJECTS_DICT

    exported = {n for n in dir(keras.metrics) if not n.startswith("_")} - NOT_METRICS
    return exported | set(ALL_OBJECTS_DICT)


def test_every_keras_metric_name_and_class_is_covered():
    keras = real_keras()
    names = _keras_names(keras)
    placed = set(KERAS_MEANS) | set(KERAS_REFUSED) | FITKIT_NAMES
    assert names - placed == set(), "Keras names fitkit neither computes nor refuses"
    assert {n.lower() for n in FITKIT_NAMES} <= {*NAMES, *ALIASES, "auc"}
    for name in sorted(names & set(KERAS_REFUSED)):
        with pytest.raises(ValueError, match=r"keras\.metrics\.|fitkit|torchmetrics|custom `train_step`") as raised:
            check_metrics([name])  # what compile(metrics=[name]) runs
        assert name in str(raised.value)


# -- names, beside Keras ----------------------------------------------------------------------------
def _data(kind):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(N, 6, generator=g)
    w = torch.rand(N, 1, generator=g) * 2
    if kind in ("binary", "raw_binary"):
        return x, (x[:, :1] + 0.7 * torch.randn(N, 1, generator=g) > 0).float(), w
    if kind in ("sparse", "onehot", "probs"):
        labels = (x.argmax(-1) + torch.randint(0, 3, (N,), generator=g)) % 6
        return x, (labels if kind == "sparse" else torch.nn.functional.one_hot(labels, 6).float()), w
    return x, torch.rand(N, 3, generator=g) + 0.1, w  # regression, positive targets (mape, msle)


#: kind -> (units, Keras' activation, the torch module's own activation): Keras' model ends in
#: sigmoid / softmax where fitkit's module returns logits (the names read logits); "raw" kinds
#: give both the same outputs.
KINDS = {"binary": (1, "sigmoid", None), "sparse": (6, "softmax", None), "onehot": (6, "softmax", None),
         "raw_binary": (1, None, None), "regression": (3, None, None), "probs": (6, "softmax", torch.nn.Softmax(-1))}

#: Every name computed here, by the data it is checked on.
NAME_KINDS = {
    "binary": ["binary_accuracy", "BinaryAccuracy", "binary_crossentropy", "bce", "BCE", "BinaryCrossentropy",
               "binary_focal_crossentropy", "true_positives", "TruePositives", "false_positives", "FalsePositives",
               "true_negatives", "TrueNegatives", "false_negatives", "FalseNegatives", "Precision", "Recall",
               "precision", "recall", "accuracy", "acc"],
    "sparse": ["sparse_categorical_accuracy", "SparseCategoricalAccuracy", "sparse_top_k_categorical_accuracy",
               "SparseTopKCategoricalAccuracy", "sparse_categorical_crossentropy", "SparseCategoricalCrossentropy",
               "accuracy"],
    "onehot": ["categorical_accuracy", "CategoricalAccuracy", "top_k_categorical_accuracy", "TopKCategoricalAccuracy",
               "categorical_crossentropy", "CategoricalCrossentropy", "categorical_focal_crossentropy", "accuracy"],
    "raw_binary": ["hinge", "Hinge", "squared_hinge", "SquaredHinge"],
    "regression": ["mean_absolute_error", "mae", "MAE", "MeanAbsoluteError", "mean_squared_error", "mse", "MSE",
                   "MeanSquaredError", "root_mean_squared_error", "RootMeanSquaredError",
                   "mean_absolute_percentage_error", "mape", "MAPE", "MeanAbsolutePercentageError",
                   "mean_squared_logarithmic_error", "msle", "MSLE", "MeanSquaredLogarithmicError", "cosine_similarity",
                   "CosineSimilarity", "log_cosh", "log_cosh_error", "LogCoshError", "huber", "pearson_correlation",
                   "PearsonCorrelation", "concordance_correlation", "ConcordanceCorrelation", "categorical_hinge",
                   "CategoricalHinge", "accuracy", "Accuracy"],
    "probs": ["kl_divergence", "KLDivergence", "poisson", "Poisson"],
}
#: Names Keras' `metrics.get` does not take as text (exported as functions only): Keras is given the function.
FUNCTION_ONLY = {"binary_focal_crossentropy", "categorical_focal_crossentropy", "huber", "log_cosh"}


def test_every_computed_name_is_checked_beside_keras():
    assert {n for names in NAME_KINDS.values() for n in names} >= set(KERAS_MEANS)


def _twins(keras, kind):
    units, kact, tact = KINDS[kind]
    kmodel, net = twin_dense(keras, 6, units, activation=kact)
    return kmodel, (torch.nn.Sequential(net, tact) if tact is not None else net)


def _keras_spec(keras, name):
    return getattr(keras.metrics, name) if name in FUNCTION_ONLY else name


#: The compiled loss of each kind in Keras (on its probabilities) and in fitkit (on the logits).
LOSSES = {"binary": "binary_crossentropy", "sparse": "sparse_categorical_crossentropy",
          "onehot": "categorical_crossentropy"}


@pytest.mark.parametrize("kind", list(NAME_KINDS))
def test_keras_names_give_keras_values_plain_and_weighted(kind):
    keras = real_keras()
    x, y, w = _data(kind)
    names = list(dict.fromkeys(NAME_KINDS[kind]))
    if kind in ("sparse", "onehot"):  # "accuracy" is checked per kind; Keras logs a name once
        names = [n for n in names if n not in ("acc",)]
    weighted = [n for n in names if n not in ("auc", "AUC")]
    kmodel, net = _twins(keras, kind)
    kmodel.compile("sgd", LOSSES.get(kind, "mse"), metrics=[_keras_spec(keras, n) for n in names],
                   weighted_metrics=[_keras_spec(keras, n) for n in weighted])
    theirs = kmodel.evaluate(x.numpy(), y.numpy(), sample_weight=w.numpy(), batch_size=BATCH, verbose=0,
                             return_dict=True)
    model = Model(net).compile("sgd", LOSSES.get(kind, "mse"), metrics=names, weighted_metrics=weighted)
    ours = model.evaluate(x, y, sample_weight=w, batch_size=BATCH, verbose=0, return_dict=True)
    theirs.pop("loss"), ours.pop("loss")
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        # the crossentropies: Keras clips probabilities at 1e-7, fitkit reads the logits
        assert ours[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_weighted_metrics_in_fit_equal_keras_per_epoch_with_the_same_weights_after():
    """The guide's `weighted_metrics=["accuracy"]` beside `metrics=["accuracy"]`: Keras logs the
    weighted one as `weighted_accuracy`, in training and validation, per epoch."""
    keras = real_keras()
    x, y, w = _data("sparse")
    kmodel, net = twin_dense(keras, 6, 6, activation="softmax")  # Keras' names read probabilities, fitkit's logits
    kmodel.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", metrics=["accuracy"], weighted_metrics=["accuracy", "sparse_categorical_crossentropy"])
    model = Model(net).compile("sgd", "sparse_categorical_crossentropy", learning_rate=0.1,
                               metrics=["accuracy"], weighted_metrics=["accuracy", "sparse_categorical_crossentropy"])
    xv, yv, wv = x[:8] * 0.5, y[:8], w[:8]
    fit = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    theirs = kmodel.fit(x.numpy(), y.numpy(), sample_weight=w.numpy(),
                        validation_data=(xv.numpy(), yv.numpy(), wv.numpy()), **fit).history
    ours = model.fit(x, y, sample_weight=w, validation_data=(xv, yv, wv), **fit).history
    assert sorted(ours) == sorted(theirs)
    assert "weighted_accuracy" in ours and "val_weighted_accuracy" in ours
    for key, values in theirs.items():
        # the weighted crossentropy: Keras' metric reads the softmax of the same logits
        assert ours[key] == pytest.approx(values, rel=1e-5), key
    torch.testing.assert_close(net.weight.detach(), keras_weights(kmodel)[0], rtol=1e-5, atol=1e-6)


def test_weighted_metrics_per_output_equal_keras():
    from test_keras_multi_io import _data as two_head_data
    from test_keras_multi_io import _twins as two_head_twins

    keras = real_keras()
    xa, xb, ys, yc = two_head_data()
    rng = np.random.default_rng(5)
    ws, wc = rng.uniform(0, 2, size=(len(xa),)).astype("float32"), rng.uniform(0, 2, size=(len(xa), 1)).astype("float32")
    kmodel, model = two_head_twins(keras)
    sce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kmodel.compile("sgd", loss={"score": "mse", "cls": sce}, metrics={"score": ["mae"], "cls": ["accuracy"]},
                   weighted_metrics={"score": ["mae"], "cls": ["accuracy"]})
    model.compile("sgd", loss={"score": "mse", "cls": "sparse_categorical_crossentropy"},
                  metrics={"score": ["mae"], "cls": ["accuracy"]}, weighted_metrics={"score": ["mae"], "cls": ["accuracy"]})
    y, sw = {"score": ys, "cls": yc}, {"score": ws, "cls": wc}
    theirs = kmodel.evaluate([xa, xb], y, sample_weight=sw, batch_size=BATCH, verbose=0, return_dict=True)
    ours = model.evaluate((xa, xb), y, sample_weight=sw, batch_size=BATCH, verbose=0, return_dict=True)
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        assert ours[key] == pytest.approx(value, rel=1e-5), key


def test_the_error_of_a_misspelled_keras_name_suggests_the_name():
    model = Model(torch.nn.Linear(2, 1))
    with pytest.raises(ValueError, match="did you mean 'mean_absolute_percentage_error'"):
        model.compile("sgd", "mse", metrics=["mean_absolute_percentage_eror"])
    with pytest.raises(ValueError, match=r"`weighted_metrics` cannot weight 'auc'.*keras\.metrics"):
        model.compile("sgd", "mse", weighted_metrics=["auc"])


# -- keras.metrics objects, beside Keras ------------------------------------------------------------
#: kind -> (units, activation of both the Keras model and the torch module: objects see the outputs as they are)
OBJECT_KINDS = {"binary": (1, "sigmoid"), "sparse": (6, "softmax"), "onehot": (6, "softmax"), "regression": (3, None)}
#: Every class keras.metrics exports, with the arguments it needs and the data it is checked on
#: (None: not a metric one compiles: `Metric` is the abstract base, `Mean` and `Sum` track values
#: given to them, and fitkit refuses them as Keras' compile does).
OBJECTS = {
    "AUC": ("binary", {}), "Accuracy": ("regression", {}), "BinaryAccuracy": ("binary", {}),
    "BinaryCrossentropy": ("binary", {}), "BinaryIoU": ("binary", {"target_class_ids": (0, 1)}),
    "CategoricalAccuracy": ("onehot", {}), "CategoricalCrossentropy": ("onehot", {}), "CategoricalHinge": ("onehot", {}),
    "ConcordanceCorrelation": ("regression", {}), "CosineSimilarity": ("regression", {}),
    "F1Score": ("onehot", {"average": "macro"}), "FBetaScore": ("onehot", {"average": "micro", "beta": 2.0}),
    "FalseNegatives": ("binary", {}), "FalsePositives": ("binary", {}), "Hinge": ("binary", {}),
    "IoU": ("sparse", {"num_classes": 6, "target_class_ids": [0, 1], "sparse_y_pred": False}),
    "KLDivergence": ("onehot", {}), "LogCoshError": ("regression", {}), "Mean": None,
    "MeanAbsoluteError": ("regression", {}), "MeanAbsolutePercentageError": ("regression", {}),
    "MeanIoU": ("sparse", {"num_classes": 6, "sparse_y_pred": False}), "MeanMetricWrapper": ("regression", "fn"),
    "MeanSquaredError": ("regression", {}), "MeanSquaredLogarithmicError": ("regression", {}), "Metric": None,
    "OneHotIoU": ("onehot", {"num_classes": 6, "target_class_ids": [0, 2]}),
    "OneHotMeanIoU": ("onehot", {"num_classes": 6}), "PearsonCorrelation": ("regression", {}),
    "Poisson": ("onehot", {}), "Precision": ("binary", {}), "PrecisionAtRecall": ("binary", {"recall": 0.5}),
    "R2Score": ("regression", {}), "Recall": ("binary", {}), "RecallAtPrecision": ("binary", {"precision": 0.5}),
    "RootMeanSquaredError": ("regression", {}), "SensitivityAtSpecificity": ("binary", {"specificity": 0.5}),
    "SparseCategoricalAccuracy": ("sparse", {}), "SparseCategoricalCrossentropy": ("sparse", {}),
    "SparseTopKCategoricalAccuracy": ("sparse", {"k": 2}), "SpecificityAtSensitivity": ("binary", {"sensitivity": 0.5}),
    "SquaredHinge": ("binary", {}), "Sum": None, "TopKCategoricalAccuracy": ("onehot", {"k": 2}),
    "TrueNegatives": ("binary", {}), "TruePositives": ("binary", {}),
}


def test_every_keras_metric_class_is_checked():
    keras = real_keras()
    classes = {n for n in dir(keras.metrics) if inspect.isclass(getattr(keras.metrics, n))}
    assert classes == set(OBJECTS)


def _object(keras, cls):
    """A fresh object of Keras' class `cls`, named after it (Keras numbers unnamed objects: `auc_3`)."""
    kind, kwargs = OBJECTS[cls]
    if kwargs == "fn":
        return keras.metrics.MeanMetricWrapper(fn=keras.metrics.mean_absolute_percentage_error, name="wrapped_mape")
    return getattr(keras.metrics, cls)(name=cls.lower(), **kwargs)


def _object_twins(keras, kind):
    units, activation = OBJECT_KINDS[kind]
    kmodel, net = twin_dense(keras, 6, units, activation=activation)
    act = {"sigmoid": torch.nn.Sigmoid(), "softmax": torch.nn.Softmax(-1), None: None}[activation]
    return kmodel, (torch.nn.Sequential(net, act) if act is not None else net)


@pytest.mark.parametrize("kind", list(OBJECT_KINDS))
def test_keras_metric_objects_give_keras_values_under_their_names(kind):
    keras = real_keras()
    x, y, w = _data(kind)
    w = w[:, 0]  # Keras' F1Score and IoUs take one weight a sample as (N,) only
    classes = [c for c, entry in OBJECTS.items() if entry is not None and entry[0] == kind]
    weighted = classes
    kmodel, net = _object_twins(keras, kind)
    kmodel.compile("sgd", LOSSES.get(kind, "mse"), metrics=[_object(keras, c) for c in classes],
                   weighted_metrics=[_object(keras, c) for c in weighted])
    theirs = kmodel.evaluate(x.numpy(), y.numpy(), sample_weight=w.numpy(), batch_size=BATCH, verbose=0,
                             return_dict=True)
    given = [_object(keras, c) for c in classes]
    model = Model(net).compile("sgd", LOSSES.get(kind, "mse"), metrics=given,
                               weighted_metrics=[_object(keras, c) for c in weighted])
    ours = model.evaluate(x, y, sample_weight=w, batch_size=BATCH, verbose=0, return_dict=True)
    theirs.pop("loss"), ours.pop("loss")  # fitkit's named losses read logits; these modules end in softmax
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(float(value), rel=1e-5, abs=1e-6), name
    assert all(float(np.sum([np.abs(np.asarray(v)) for v in m.variables])) == 0 for m in given)  # left untouched


def test_keras_metric_objects_reset_each_epoch_in_fit_as_keras():
    keras = real_keras()
    x, y, _ = _data("sparse")
    kmodel, net = twin_dense(keras, 6, 6)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kmodel.compile(keras.optimizers.SGD(0.1), loss, metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc"),
                                                            keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")])
    model = Model(net).compile("sgd", "sparse_categorical_crossentropy", learning_rate=0.1,
                               metrics=[keras.metrics.SparseCategoricalAccuracy(name="acc"),
                                        keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")])
    fit = dict(batch_size=BATCH, epochs=3, shuffle=False, verbose=0, validation_split=0.25)
    theirs = kmodel.fit(x.numpy(), y.numpy(), **fit).history
    ours = model.fit(x, y, **fit).history
    assert sorted(ours) == sorted(theirs)
    for key, values in theirs.items():
        assert ours[key] == pytest.approx(values, rel=1e-5), key


@pytest.mark.parametrize("cls", ["Mean", "Sum"])
def test_keras_trackers_in_compile_are_refused_clearly(cls):
    keras = real_keras()
    with pytest.raises(ValueError, match="tracker of values.*custom `train_step`"):
        Model(torch.nn.Linear(6, 1)).compile("sgd", "mse", metrics=[getattr(keras.metrics, cls)()])


def test_a_keras_metric_with_one_value_per_class_is_refused_clearly():
    keras = real_keras()
    x, y, _ = _data("onehot")
    model = Model(torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Softmax(-1)))
    model.compile("sgd", "mse", metrics=[keras.metrics.F1Score()])
    with pytest.raises(ValueError, match=r"'f1_score' gives 6 values.*average="):
        model.evaluate(x, y, verbose=0)


def test_a_keras_order_function_averages_per_sample_as_keras():
    keras = real_keras()
    x, y, _ = _data("regression")
    kmodel, net = twin_dense(keras, 6, 3)

    def per_sample_max_error(y_true, y_pred):
        return (y_true - y_pred).abs().amax(-1)

    def keras_max_error(y_true, y_pred):
        return keras.ops.max(keras.ops.abs(y_true - y_pred), axis=-1)

    keras_max_error.__name__ = "per_sample_max_error"
    kmodel.compile("sgd", "mse", metrics=[keras_max_error, keras.metrics.mean_absolute_percentage_error])
    theirs = kmodel.evaluate(x.numpy(), y.numpy(), batch_size=BATCH, verbose=0, return_dict=True)
    ours = Model(net).compile("sgd", "mse", metrics=[per_sample_max_error, keras.metrics.mean_absolute_percentage_error]) \
        .evaluate(x, y, batch_size=12, verbose=0, return_dict=True)  # a partial last batch: still the mean over samples
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(value, rel=1e-5), name


def test_a_torchmetrics_object_never_logs_another_value_under_a_keras_name():
    """torchmetrics' MAPE is a fraction where Keras' is a percentage: logged under its own name."""
    import torchmetrics

    x, y, _ = _data("regression")
    ours = Model(torch.nn.Linear(6, 3)).compile("sgd", "mse", metrics=[
        torchmetrics.MeanAbsolutePercentageError(), "mape", torchmetrics.MeanAbsoluteError()]).evaluate(x, y, verbose=0, return_dict=True)
    assert ours["mape"] == pytest.approx(100 * ours["torchmetrics_mean_absolute_percentage_error"], rel=1e-5)
    assert "mean_absolute_error" in ours  # the same value as Keras': Keras' name kept


def test_weighted_metrics_in_a_custom_train_step_equal_keras():
    """The guide's custom `train_step` handing `sample_weight` to `compute_metrics`: the
    weighted metrics see it, the others do not, as in Keras."""
    keras = real_keras()
    x, y, w = _data("regression")
    kmodel, net = twin_dense(keras, 6, 3)
    kmodel.compile("sgd", "mse", metrics=["mae"], weighted_metrics=["mae", "mape"])
    theirs = kmodel.fit(x.numpy(), y.numpy(), sample_weight=w.numpy(), batch_size=BATCH, epochs=2, shuffle=False,
                        verbose=0).history

    class Custom(Model):
        def train_step(self, data):
            x, y, sample_weight = data
            y_pred = self(x)
            loss = self.compute_loss(y=y, y_pred=y_pred, sample_weight=sample_weight)
            self.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
            return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    model = Custom(net).compile("sgd", "mse", metrics=["mae"], weighted_metrics=["mae", "mape"])
    ours = model.fit(x, y, sample_weight=w, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    assert sorted(ours) == sorted(theirs)
    for key, values in theirs.items():
        assert ours[key] == pytest.approx(values, rel=1e-5), key


def test_weighted_metrics_survive_save_and_load(tmp_path):
    x, y, w = _data("regression")
    model = Model(torch.nn.Linear(6, 3)).compile("sgd", "mse", metrics=["mae"], weighted_metrics=["mae", "msle"])
    before = model.evaluate(x, y, sample_weight=w, verbose=0, return_dict=True)
    model.save(tmp_path / "model.pt")
    loaded = Model.load(tmp_path / "model.pt", torch.nn.Linear(6, 3))
    assert loaded.evaluate(x, y, sample_weight=w, verbose=0, return_dict=True) == pytest.approx(before)
    assert {"weighted_mae", "msle"} <= set(before)


def test_keras_metric_states_resume_exactly():
    """A checkpoint taken mid-epoch holds the running sums of Keras' metrics (names and objects)."""
    keras = real_keras()
    from fitkit.adapters.metric_specs import weighted_metrics
    from fitkit.adapters.metrics import MetricSet

    x, y, w = _data("binary")
    specs = check_metrics(["mape", keras.metrics.AUC(name="auc_object")])
    specs += weighted_metrics(["Precision"], specs)
    whole, first, resumed = MetricSet(specs), MetricSet(specs), MetricSet(specs)
    for part in (slice(0, 16), slice(16, 32)):
        whole.update(x[part, :1], y[part], w[part])
    first.update(x[:16, :1], y[:16], w[:16])
    resumed.load_state(first.export_state())
    resumed.update(x[16:, :1], y[16:], w[16:])
    assert resumed.compute() == pytest.approx(whole.compute(), rel=1e-6)


def test_keras_precision_and_recall_by_class_name_on_several_labels_equal_keras():
    """`"Precision"` / `"Recall"` are Keras' classes: every element thresholded (micro); so are
    `"precision"` / `"recall"` on targets of the outputs' shape (on class indices, which Keras'
    metric does not take, they are fitkit's macro average over the classes)."""
    keras = real_keras()
    x, y, w = _data("onehot")
    kmodel, net = twin_dense(keras, 6, 6, activation="sigmoid")
    names = ["Precision", "Recall", "precision", "recall"]
    kmodel.compile("sgd", "binary_crossentropy", metrics=names, weighted_metrics=["Precision"])
    theirs = kmodel.evaluate(x.numpy(), y.numpy(), sample_weight=w.numpy(), verbose=0, return_dict=True)
    ours = Model(net).compile("sgd", "binary_crossentropy", metrics=names,
                              weighted_metrics=["Precision"]).evaluate(x, y, sample_weight=w, verbose=0, return_dict=True)
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        assert ours[name] == pytest.approx(value, rel=1e-5), name
