"""hyperparameter_search through Optuna: real trials, a real SQLite storage, real pruning."""

import gc
import os
import subprocess
import sys
import weakref

import pytest
import torch

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)

from fitkit import BestRun, Model, TrainerCallback  # noqa: E402

FINISHED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(240, 8, generator=g)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long()
    return x, y


def _model_init(calls=None):
    def model_init(trial):
        if calls is not None:
            calls.append(trial)
        hidden = trial.suggest_int("hidden", 4, 16) if trial is not None else 8
        return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 2))

    return model_init


def _lr_space(trial):
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-1, log=True), "epochs": 2}


def test_trials_build_fresh_models_and_the_sqlite_study_holds_them(tmp_path):
    x, y = _data()
    calls = []
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    model = Model(model_init=_model_init(calls)).compile("adam", "cross_entropy", ["accuracy"])
    best = model.hyperparameter_search(x, y, validation_split=0.25, hp_space=_lr_space, n_trials=4,
                                       direction="maximize", storage=storage, study_name="s", verbose=0,
                                       output_dir=str(tmp_path / "runs"))
    assert len(calls) == 4 and all(isinstance(t, optuna.trial.Trial) for t in calls)
    assert len({t.number for t in calls}) == 4
    study = optuna.load_study(study_name="s", storage=storage)
    assert len(study.trials) == 4
    assert isinstance(best, BestRun)
    assert best.objective == study.best_value and best.run_id == str(study.best_trial.number)
    assert best.hyperparameters == study.best_trial.params and set(best.hyperparameters) == {"learning_rate", "hidden"}


def test_callbacks_see_the_search_state_and_trial_dirs(tmp_path):
    x, y = _data()
    seen = []

    class Spy(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            seen.append((state.is_hyper_param_search, state.trial_name, dict(state.trial_params), args.output_dir))

    model = Model(model_init=_model_init()).compile("adam", "cross_entropy")
    model.hyperparameter_search(x, y, validation_split=0.25, hp_space=_lr_space, n_trials=2, verbose=0,
                                callbacks=[Spy()], hp_name=lambda t: f"trial-{t.number}",
                                output_dir=str(tmp_path), save_strategy="epoch")
    assert [s[0] for s in seen] == [True, True]
    assert [s[1] for s in seen] == ["trial-0", "trial-1"]
    assert set(seen[0][2]) == {"learning_rate", "hidden"}
    assert [s[3] for s in seen] == [str(tmp_path / "run-0"), str(tmp_path / "run-1")]
    assert os.path.isdir(tmp_path / "run-1" / "checkpoint-12")


def test_a_hopeless_configuration_is_pruned():
    x, y = _data()
    study = optuna.create_study(direction="minimize",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0))
    for lr in (3e-2, 3e-2, 1e-7):
        study.enqueue_trial({"learning_rate": lr, "hidden": 8})
    reports = {}

    class Count(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            reports[state.trial_params["learning_rate"]] = state.global_step

    model = Model(model_init=_model_init()).compile("adam", "cross_entropy")
    model.hyperparameter_search(
        x, y, validation_split=0.25, n_trials=3, study=study, verbose=0, callbacks=[Count()],
        hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-8, 1e-1, log=True), "epochs": 6},
    )
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.PRUNED]
    assert reports[1e-7] < reports[3e-2]  # it stopped early, and on_train_end fired
    assert len(study.trials[2].intermediate_values) < len(study.trials[0].intermediate_values)


def test_multi_objective_returns_the_pareto_front():
    x, y = _data()
    model = Model(model_init=_model_init()).compile("adam", "cross_entropy", ["accuracy"])
    front = model.hyperparameter_search(
        x, y, validation_split=0.25, hp_space=_lr_space, n_trials=4, verbose=0,
        direction=["minimize", "maximize"], study_name="pareto", storage=None,
        compute_objective=lambda m: (m["val_loss"], m["val_accuracy"]),
    )
    assert isinstance(front, list) and front and all(isinstance(b, BestRun) for b in front)
    assert all(len(b.objective) == 2 for b in front)
    # nobody on the front is dominated by another member
    for a in front:
        for b in front:
            assert not (b.objective[0] < a.objective[0] and b.objective[1] > a.objective[1])


def test_an_interrupted_search_continues_with_load_if_exists(tmp_path):
    x, y = _data()
    storage = f"sqlite:///{tmp_path / 'study.db'}"

    class Crash(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if args.output_dir.endswith("run-2"):
                raise KeyboardInterrupt("the machine went away")

    model = Model(model_init=_model_init()).compile("adam", "cross_entropy")
    options = dict(validation_split=0.25, hp_space=_lr_space, n_trials=5, storage=storage, study_name="resume",
                   load_if_exists=True, verbose=0, output_dir=str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        model.hyperparameter_search(x, y, callbacks=[Crash()], **options)
    study = optuna.load_study(study_name="resume", storage=storage)
    assert len([t for t in study.trials if t.state in FINISHED]) == 2
    model.hyperparameter_search(x, y, **options)
    study = optuna.load_study(study_name="resume", storage=storage)
    assert len([t for t in study.trials if t.state in FINISHED]) == 5  # two before the crash, three after


def test_memory_does_not_grow_with_trials():
    x, y = _data()

    def live_modules():
        gc.collect()
        return sum(isinstance(o, torch.nn.Module) for o in gc.get_objects())

    model = Model(model_init=_model_init()).compile("adam", "cross_entropy")
    study = optuna.create_study()
    model.hyperparameter_search(x, y, validation_split=0.25, hp_space=_lr_space, n_trials=2, study=study, verbose=0)
    after_two = live_modules()
    model.hyperparameter_search(x, y, validation_split=0.25, hp_space=_lr_space, n_trials=20, study=study, verbose=0)
    assert len(study.trials) == 20
    assert live_modules() <= after_two
    assert gc.get_freeze_count() == 0  # what the search froze is given back to the collector


class _TrialModel:
    """What `TrialMemory.release` sees of a trial's `Model`: a module, dropped by `release()`."""

    def __init__(self, in_a_cycle):
        self.module = torch.nn.Linear(2, 2)
        if in_a_cycle:  # as the engine's objects hold it: only a collection frees it
            self.module.__dict__["loop"] = [self.module]

    def release(self):
        self.module = None


def test_a_finished_trial_is_collected_only_when_its_module_outlives_it():
    from fitkit.search.memory import TrialMemory

    def released(memory, in_a_cycle, **kwargs):
        trial_model = _TrialModel(in_a_cycle)
        module = weakref.ref(trial_model.module)
        collected = memory.release(trial_model, **kwargs)
        return collected, module() is None

    frozen = gc.get_freeze_count()
    with TrialMemory() as memory:
        assert frozen or gc.get_freeze_count() > 0  # the heap before the search is out of the collection's way
        assert released(memory, in_a_cycle=False) == (False, True)  # freed by reference counting: no collection
        assert released(memory, in_a_cycle=True) == (True, True)
    assert gc.get_freeze_count() == frozen
    with TrialMemory(optuna_collects=True) as memory:  # gc_after_trial=True: Optuna's full collection
        assert gc.get_freeze_count() == frozen
        assert released(memory, in_a_cycle=True)[0] is False  # Optuna collects right after the trial
        assert released(memory, in_a_cycle=True, optuna_follows=False) == (True, True)  # a follower rank
    assert memory.collections == 1


def _cycle_garbage(run):
    """What `run()` leaves that only a collection frees (its objects in reference cycles)."""
    gc.collect()
    gc.disable()
    try:
        run()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
    finally:
        gc.set_debug(0)
        gc.enable()
    garbage = list(gc.garbage)
    gc.garbage.clear()
    return garbage


class _OwnLoss(Model):
    def compute_loss(self, x, y, y_pred, sample_weight=None):
        return torch.nn.functional.cross_entropy(y_pred, y)


@pytest.mark.parametrize("case", ["fit", "fit_with_callbacks", "compute_loss", "evaluate_predict"])
def test_a_run_leaves_no_reference_cycle_holding_its_module(case, tmp_path):
    """A trial's module, optimizer and the loop around them are freed by reference counting when
    the run is dropped: the search then needs no garbage collection between trials."""
    from fitkit.callbacks import EarlyStopping, ModelCheckpoint, ReduceLROnPlateau

    x, y = _data()

    def run():
        model = (_OwnLoss if case == "compute_loss" else Model)(_model_init()(None))
        model.compile("adam", None if case == "compute_loss" else "cross_entropy", ["accuracy"])
        if case == "evaluate_predict":
            model.evaluate(x, y, verbose=0)
            model.predict(x, verbose=0)
            return
        callbacks = [EarlyStopping(), ModelCheckpoint(str(tmp_path / "best.pt")), ReduceLROnPlateau()] \
            if case == "fit_with_callbacks" else []
        for again in range(2):  # a fit again on the same data: its first-batch checks are not run again
            model.fit(x, y, validation_split=0.25, epochs=2, verbose=0, output_dir=str(tmp_path / f"{case}-{again}"),
                      callbacks=callbacks)

    run()  # first-use set-up (imports, caches) is not the run's
    garbage = _cycle_garbage(run)
    ours = [type(o).__qualname__ for o in garbage
            if isinstance(o, (torch.nn.Module, torch.Tensor, torch.optim.Optimizer))
            or type(o).__module__.startswith("fitkit.")]
    assert not ours, ours  # (torch.save's own per-call Pickler class is a cycle: not fitkit's)


def test_a_search_of_plain_trials_runs_no_collection(monkeypatch):
    from fitkit.search import memory

    collections = []
    monkeypatch.setattr(memory.gc, "collect", lambda *a: collections.append(a) or 0)
    x, y = _data()
    model = Model(model_init=_model_init()).compile("adam", "cross_entropy", ["accuracy"])
    study = optuna.create_study()
    model.hyperparameter_search(x, y, validation_split=0.25, hp_space=_lr_space, n_trials=3, study=study, verbose=0)
    assert len(study.trials) == 3
    assert collections == []  # each trial's module was freed when its model was released


def test_errors_name_the_argument():
    x, y = _data()
    with pytest.raises(ValueError, match="hyperparameter_search needs `model_init`"):
        Model(_model_init()(None)).compile("adam", "cross_entropy").hyperparameter_search(x, y)
    model = Model(model_init=_model_init()).compile("adam", "cross_entropy")
    with pytest.raises(ValueError, match=r"hp_space returned \['width'\].*Valid names: .*learning_rate"):
        model.hyperparameter_search(x, y, n_trials=1, hp_space=lambda t: {"width": 3}, verbose=0)
    with pytest.raises(ValueError, match="unknown backend 'ray'"):
        model.hyperparameter_search(x, y, backend="ray")
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['n_trial'\]"):
        model.hyperparameter_search(x, y, n_trial=3)
    net = _model_init()(None)
    bad = Model(model_init=_model_init()).compile(torch.optim.SGD(net.parameters(), lr=0.1), "cross_entropy")
    with pytest.raises(ValueError, match="`optimizer` is an Optimizer instance"):
        bad.hyperparameter_search(x, y)


# usage: worker.py STORAGE_URL FOLDER. A worker's first trial waits until the other worker has
# started one too (a file each in FOLDER): however the two processes are scheduled, both get a
# trial, and neither can finish the study alone first.
WORKER = r"""
import os, sys, time, torch, optuna
from fitkit import Model
optuna.logging.set_verbosity(optuna.logging.WARNING)
storage = optuna.storages.RDBStorage(sys.argv[1], engine_kwargs={"connect_args": {"timeout": 60}})
folder = sys.argv[2]
g = torch.Generator().manual_seed(0)
x = torch.randn(240, 8, generator=g); y = (x[:, 0] > 0).long()
waited = []
def model_init(trial):
    if trial is not None and not waited:
        waited.append(trial.number)
        open(os.path.join(folder, f"started-{os.getpid()}"), "w").close()
        deadline = time.monotonic() + 120
        while len([n for n in os.listdir(folder) if n.startswith("started-")]) < 2:
            if time.monotonic() > deadline:
                raise TimeoutError("the other worker never started a trial")
            time.sleep(0.02)  # polling for the other worker's file, not a timing assumption
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
model = Model(model_init=model_init).compile("adam", "cross_entropy")
model.hyperparameter_search(x, y, validation_split=0.25, n_trials=6, storage=storage, study_name="shared",
    load_if_exists=True, verbose=0, hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-3, 1e-1),
    "epochs": 3}, optuna_callbacks=[lambda study, trial: print("TRIAL", trial.number, flush=True)])
"""


@pytest.mark.slow
def test_two_processes_share_one_storage(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    optuna.create_study(study_name="shared", storage=url)
    (tmp_path / "started").mkdir()
    procs = [subprocess.Popen([sys.executable, str(script), url, str(tmp_path / "started")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    ran = [[int(l.split()[1]) for l in out.splitlines() if l.startswith("TRIAL")] for out, _ in outs]
    assert all(ran), ran  # both did some of the work
    assert not set(ran[0]) & set(ran[1])  # and never the same trial
    study = optuna.load_study(study_name="shared", storage=url)
    finished = [t for t in study.trials if t.state in FINISHED]  # the default MedianPruner may prune some
    assert len(finished) == 6  # trials are claimed against the storage: exactly n_trials, never one more


def test_trials_with_other_batch_sizes_report_at_the_same_epoch_steps():
    x, y = _data()
    study = optuna.create_study()
    for batch_size in (32, 64):
        study.enqueue_trial({"batch_size": batch_size, "hidden": 8})
    model = Model(model_init=_model_init()).compile("adam", "cross_entropy")
    model.hyperparameter_search(x, y, validation_split=0.25, n_trials=2, study=study, verbose=0, epochs=3,
                                hp_space=lambda t: {"batch_size": t.suggest_categorical("batch_size", [32, 64])})
    assert [sorted(t.intermediate_values) for t in study.trials] == [[1, 2, 3], [1, 2, 3]]


def test_evaluations_by_steps_report_thousandths_of_an_epoch():
    x, y = _data()  # 180 training samples: 6 batches of 32 an epoch (the last one short)
    study = optuna.create_study()
    model = Model(model_init=_model_init()).compile("adam", "cross_entropy")
    model.hyperparameter_search(x, y, validation_split=0.25, n_trials=1, study=study, verbose=0, epochs=1,
                                batch_size=32, eval_strategy="steps", eval_steps=3,
                                hp_space=lambda t: {"learning_rate": 1e-2})
    assert sorted(study.trials[0].intermediate_values) == [500, 1000]


def test_trial_user_attributes_hold_metrics_output_dir_and_checkpoint(tmp_path):
    x, y = _data()
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    model = Model(model_init=_model_init()).compile("adam", "cross_entropy", ["accuracy"])
    best = model.hyperparameter_search(x, y, validation_split=0.25, hp_space=_lr_space, n_trials=2, verbose=0,
                                       direction="maximize", storage=storage, study_name="attrs",
                                       output_dir=str(tmp_path / "runs"), save_strategy="epoch",
                                       load_best_model_at_end=True, metric_for_best_model="val_accuracy")
    study = optuna.load_study(study_name="attrs", storage=storage)
    for trial in study.trials:
        attrs = trial.user_attrs
        assert attrs["output_dir"] == str(tmp_path / "runs" / f"run-{trial.number}")
        assert {"loss", "val_loss", "val_accuracy"} <= set(attrs["metrics"])
        assert trial.value == pytest.approx(attrs["metrics"]["val_accuracy"])
        assert attrs["best_checkpoint"].startswith(attrs["output_dir"]) and os.path.isdir(attrs["best_checkpoint"])
    # the best run's checkpoint, from the study alone
    assert best.run_summary == study.best_trial.user_attrs
    assert os.path.isdir(study.best_trial.user_attrs["best_checkpoint"])


def test_storage_defaults_heartbeats_and_constant_liar(tmp_path):
    from fitkit.search import GRACE_INTERVALS, HEARTBEAT_INTERVAL, open_study, split_options

    def opened(**options):
        study_kwargs, _, storage_options, _ = split_options(dict(options))
        study = open_study(study_kwargs, storage_options, "minimize")
        return study, study._storage._backend

    study, backend = opened(storage=f"sqlite:///{tmp_path / 'a.db'}", study_name="a")
    assert backend.heartbeat_interval == HEARTBEAT_INTERVAL
    assert backend.grace_period == GRACE_INTERVALS * HEARTBEAT_INTERVAL
    assert backend.engine.pool._pre_ping
    assert isinstance(study.sampler, optuna.samplers.TPESampler) and study.sampler._constant_liar
    _, backend = opened(storage=f"sqlite:///{tmp_path / 'b.db'}", study_name="b", heartbeat_interval=None)
    assert backend.heartbeat_interval is None
    _, backend = opened(storage=f"sqlite:///{tmp_path / 'c.db'}", study_name="c", heartbeat_interval=5,
                        grace_period=7)
    assert (backend.heartbeat_interval, backend.grace_period) == (5, 7)
    with pytest.raises(ValueError, match="`heartbeat_interval`=-1 is invalid"):
        opened(storage=f"sqlite:///{tmp_path / 'd.db'}", heartbeat_interval=-1)


def test_a_model_subclass_runs_its_own_step_and_keeps_its_attributes_in_every_trial():
    """A `Model` subclass (its own `train_step`, an attribute its `__init__` set) is what each trial trains."""
    steps = []

    class Counting(Model):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.tag = "mine"

        def train_step(self, data):
            steps.append(type(self).__name__ + ":" + self.tag)
            return super().train_step(data)

    x, y = _data()
    model = Counting(model_init=_model_init()).compile(optimizer="sgd", loss="cross_entropy")
    best = model.hyperparameter_search(x, y, hp_space=lambda t: {"epochs": 1}, n_trials=2, batch_size=120,
                                       compute_objective=lambda m: m["loss"], verbose=0)
    assert isinstance(best, BestRun)
    # 2 trials x 1 epoch x 2 batches, every one through the subclass's step with its attribute
    assert steps == ["Counting:mine"] * 4
