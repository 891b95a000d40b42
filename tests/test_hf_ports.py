"""The ported Hugging Face example scripts (examples/hf/): each task's Trainer form and fitkit
form differ only in the Trainer lines (counted here, per task), and both forms give the same
results files, log history and weights on the same data, seed and tiny model (dropout off, but
for the multiple-choice port)."""

import difflib
import importlib.util
import json
import math
import os
import sys

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("datasets")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORTS = os.path.join(ROOT, "examples", "hf")
#: The lines that change from the Trainer form to fitkit's, per task (what the port costs).
CHANGED_LINES = {"ner": 9, "clm": 9, "translation": 14, "swag": 8, "summarization": 10, "qa": 13}
#: Values of the result files that are timings (they differ run to run).
TIMINGS = ("_runtime", "_per_second")
#: argv of each task's run in the tests: tiny, one thread, no checkpoints.
COMMON = ["--report_to", "none", "--disable_tqdm", "true", "--save_strategy", "no", "--seed", "0",
          "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "8", "--eval_strategy", "epoch"]
ARGV = {
    "ner": ["--num_train_epochs", "1", "--learning_rate", "3e-3"],
    # 36 blocks in whole batches of 6: on a last, smaller batch fitkit's `train_loss` weighs each
    # step by its samples where the Trainer takes the plain mean of the steps' losses
    "clm": ["--num_train_epochs", "1", "--learning_rate", "3e-3", "--per_device_train_batch_size", "6"],
    "translation": ["--num_train_epochs", "2", "--learning_rate", "5e-3", "--predict_with_generate", "true"],
    # dropout on: the same masks in both forms (the Trainer's data order and random draws)
    "swag": ["--num_train_epochs", "2", "--learning_rate", "3e-3", "--logging_steps", "4"],
    # generation's length and beams from the arguments (Seq2SeqTrainingArguments), not the calls
    "summarization": ["--num_train_epochs", "3", "--learning_rate", "1e-2", "--predict_with_generate", "true",
                      "--generation_max_length", "8", "--generation_num_beams", "2"],
    # unlabeled evaluation features, post-processed into answers at each evaluation; the best
    # checkpoint by F1 (the last option of a name wins: checkpoints written here)
    "qa": ["--num_train_epochs", "3", "--learning_rate", "5e-3", "--logging_steps", "4", "--save_strategy", "epoch",
           "--load_best_model_at_end", "true", "--metric_for_best_model", "f1"],
}


def _lines(task, form):
    name = f"run_{task}.py" if form == "hf" else f"run_{task}_fitkit.py"
    with open(os.path.join(PORTS, name), encoding="utf-8") as f:
        return f.read().splitlines()


def changed(task):
    """The hunks of the port: (the Trainer form's lines, fitkit's lines) for each change, and the
    number of changed lines (per hunk the longer side; blank lines not counted)."""
    hf, ours = _lines(task, "hf"), _lines(task, "fitkit")
    hunks = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=hf, b=ours, autojunk=False).get_opcodes():
        if tag != "equal":  # blank lines left out (the import sorter's blank line before `from fitkit import`)
            hunks.append(([s for s in hf[i1:i2] if s.strip()], [s for s in ours[j1:j2] if s.strip()]))
    return hunks, sum(max(len(a), len(b)) for a, b in hunks)


@pytest.mark.parametrize("task", sorted(CHANGED_LINES))
def test_the_port_changes_only_the_trainer_lines(task):
    hunks, count = changed(task)
    print(f"\n{task}: {count} changed lines in {len(hunks)} places")
    assert count == CHANGED_LINES[task], f"run_{task}: {count} changed lines, {CHANGED_LINES[task]} expected"
    for before, after in hunks:
        if not before and not after:
            continue
        first = (before or after)[0]
        # every change starts on a Trainer line: the import, the constructor, or a call on `trainer`
        assert "Trainer" in first or "trainer" in first or "Model" in first, (before, after)
        assert all("Trainer(" not in line and ".train()" not in line for line in after), after


def _run(task, form, out):
    name = f"run_{task}.py" if form == "hf" else f"run_{task}_fitkit.py"
    spec = importlib.util.spec_from_file_location(f"port_{task}_{form}", os.path.join(PORTS, name))
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, PORTS)  # the scripts import `offline` from beside them, as when run as scripts
    sys.modules[spec.name] = module  # their dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        module.main(["--output_dir", str(out), *COMMON, *ARGV[task]])
    finally:
        sys.path.remove(PORTS)
        del sys.modules[spec.name]
    return out


@pytest.fixture(scope="module", params=sorted(CHANGED_LINES))
def both(request, tmp_path_factory):
    task = request.param
    tmp = tmp_path_factory.mktemp(task)
    return task, _run(task, "hf", tmp / "hf"), _run(task, "fitkit", tmp / "fitkit")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f) if path.endswith(".json") else f.read()


@pytest.mark.slow
def test_both_forms_write_the_same_results(both):
    task, hf, ours = both
    for name in ("train_results.json", "eval_results.json", "all_results.json"):
        theirs, mine = _read(os.path.join(hf, name)), _read(os.path.join(ours, name))
        assert set(theirs) == set(mine), name
        for key, value in mine.items():
            if not key.endswith(TIMINGS):
                assert math.isclose(value, theirs[key], rel_tol=1e-6, abs_tol=1e-5), (task, name, key, value, theirs[key])
    if task == "clm":
        assert _read(os.path.join(ours, "eval_results.json"))["perplexity"] > 1
    for name in {"ner": ["predictions.txt"], "translation": ["generated_predictions.txt"],
                 "summarization": ["generated_predictions.txt"],
                 "qa": ["eval_predictions.json", "predict_predictions.json"]}.get(task, []):
        assert _read(os.path.join(ours, name)) == _read(os.path.join(hf, name)), name
    for name in ("config.json", "model.safetensors", "tokenizer.json", "trainer_state.json"):
        assert os.path.isfile(os.path.join(ours, name)), name
    states = [_read(os.path.join(d, "trainer_state.json")) for d in (ours, hf)]
    assert states[0]["global_step"] == states[1]["global_step"]
    best = [os.path.basename(s["best_model_checkpoint"] or "") for s in states]
    assert best[0] == best[1], best  # the same best checkpoint (qa: by F1)


@pytest.mark.slow
def test_both_forms_log_the_same_history_and_train_to_the_same_weights(both):
    from safetensors.torch import load_file

    task, hf, ours = both
    theirs, mine = (_read(os.path.join(d, "trainer_state.json"))["log_history"] for d in (hf, ours))
    assert len(mine) == len(theirs), task
    for record, other in zip(mine, theirs):
        assert set(record) == set(other), (task, record, other)
        for key, value in record.items():
            if not key.endswith(TIMINGS):
                assert math.isclose(value, other[key], rel_tol=1e-5, abs_tol=1e-5), (task, key, record, other)
    theirs, mine = (load_file(os.path.join(d, "model.safetensors")) for d in (hf, ours))
    assert set(mine) == set(theirs)
    for name, value in mine.items():
        assert (value - theirs[name]).abs().max() <= 1e-5, (task, name)
