"""Every public method and property of the installed `transformers.Trainer` (and what
`Seq2SeqTrainer` adds) has a line in docs/migrating-from-hf.md's Trainer-call table: fitkit's
counterpart, or "none" / "not applicable" with what to write instead. A method that a new
transformers release adds fails here until the table covers it. The table also covers every
Trainer call of HF's official PyTorch example scripts (listed below, read from the scripts)."""

import inspect
import os
import re

import pytest

from fitkit import Model

transformers = pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "migrating-from-hf.md")
SECTION = "## The Trainer calls of HF's example scripts"
REFUSALS = ("none", "not applicable")

#: What run_glue, run_ner, run_clm, run_mlm, run_translation, run_summarization, run_qa and
#: run_image_classification (examples/pytorch/ of transformers) call on the Trainer and its results.
SCRIPT_CALLS = (
    "trainer = Trainer(", "trainer = Seq2SeqTrainer(", "QuestionAnsweringTrainer(",
    "preprocess_logits_for_metrics=", "trainer.train(resume_from_checkpoint=checkpoint)",
    "train_result.metrics", "trainer.save_model()", "trainer.log_metrics(", "trainer.save_metrics(",
    "trainer.save_state()", "trainer.evaluate()", "trainer.evaluate(eval_dataset=",
    "trainer.evaluate(max_length=", "trainer.predict(ds, metric_key_prefix=", "trainer.predict(ds).predictions",
    "trainer.is_world_process_zero()", "trainer.push_to_hub(", "trainer.create_model_card(",
    "predict_with_generate=True", "generation_max_length=", "generation_num_beams=",
)


def public_surface() -> dict[str, str]:
    """{name: kind} of the installed Trainer's public methods and properties, and the
    public names `Seq2SeqTrainer` defines on top of them."""
    out = {}
    for cls in (transformers.Trainer, transformers.Seq2SeqTrainer):
        for name in dir(cls):
            if name.startswith("_") or name in out:
                continue
            member = inspect.getattr_static(cls, name)
            if isinstance(member, property):
                out[name] = "property"
            elif callable(member) or isinstance(member, (staticmethod, classmethod)):
                out[name] = "method"
    return out


def table_rows() -> list[tuple[str, str, str]]:
    """(Trainer's line, fitkit's line, note) of the page's one Trainer-call table."""
    with open(PAGE, encoding="utf-8") as f:
        text = f.read()
    assert SECTION in text, f"{PAGE} lost its section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("| ---") or line.startswith("| the Trainer's line"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        assert len(cells) == 3, f"a row of the Trainer-call table has {len(cells)} cells: {line}"
        rows.append((cells[0], cells[1], cells[2]))
    return rows


ROWS = table_rows()


def test_the_installed_trainer_has_a_public_surface_to_check():
    surface = public_surface()
    assert {"train", "evaluate", "predict", "save_model", "log_metrics"} <= set(surface)
    assert "load_generation_config" in surface  # Seq2SeqTrainer's own
    assert len(surface) >= 40


@pytest.mark.parametrize("name", sorted(public_surface()))
def test_each_public_trainer_member_has_a_line(name):
    pattern = re.compile(rf"(trainer|Trainer|Seq2SeqTrainer)\.{name}\b|`{name}\(")
    hits = [row for row in ROWS if pattern.search(row[0])]
    assert hits, (f"transformers.Trainer.{name} ({transformers.__version__}) has no row in the Trainer-call table "
                  f"of docs/migrating-from-hf.md: add `trainer.{name}(...)` with fitkit's line, or 'none' / "
                  f"'not applicable' and what to write instead")


@pytest.mark.parametrize("call", SCRIPT_CALLS)
def test_each_call_of_the_example_scripts_has_a_line(call):
    assert any(call in row[0] for row in ROWS), f"{call!r} (an HF example script's) is not in the Trainer-call table"


def test_every_row_gives_a_line_or_a_reason():
    for trainer_line, ours, note in ROWS:
        assert ours and note, trainer_line
        if ours.lower() in REFUSALS:
            assert len(note) > 20, f"{trainer_line}: a refusal must say what to write instead"


def test_the_fitkit_members_the_table_names_exist():
    """`model.NAME` in fitkit's column is a member of `fitkit.Model` (the table cannot promise a
    method that is not there)."""
    named = {m for _, ours, _ in ROWS for m in re.findall(r"\bmodel\.(\w+)", ours)}
    assert {"fit", "evaluate", "hf_predict", "log_metrics", "save_metrics", "save_state"} <= named
    missing = sorted(n for n in named if not hasattr(Model, n) and n != "state")
    assert not missing, f"the Trainer-call table names Model members that do not exist: {missing}"
    from fitkit import TrainerState

    assert {"is_world_process_zero", "is_local_process_zero"} <= set(vars(TrainerState()))


def test_surface_finds_a_new_method():
    """The enumeration sees a method a later release would add."""
    class Newer(transformers.Trainer):
        def shiny_new_call(self):
            pass

    original = transformers.Trainer
    try:
        transformers.Trainer = Newer
        assert "shiny_new_call" in public_surface()
    finally:
        transformers.Trainer = original
    pattern = re.compile(r"trainer\.shiny_new_call\b")
    assert not any(pattern.search(row[0]) for row in ROWS)
