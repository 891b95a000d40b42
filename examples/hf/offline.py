"""What the ported Hugging Face example scripts would download, made in-process so that they run
offline: the raw datasets (`load_dataset`), a word-level tokenizer (`AutoTokenizer`) and the
corpus metrics (`evaluate.load("seqeval")`, `evaluate.load("sacrebleu")`, `evaluate.load("rouge")`).
`load_dataset("swag")` lays out a multiple-choice set as the Hub's `swag` ("regular") does;
`load_dataset("qa")` an extractive-QA set as `squad` does (`squad_scores`: its EM and F1).

    from offline import load_dataset, make_tokenizer, corpus_bleu
    raw = load_dataset("ner")                       # DatasetDict: train / validation / test
    tokenizer = make_tokenizer(raw)                 # a PreTrainedTokenizerFast trained on its words
"""

from __future__ import annotations

import collections
import math
import random

import datasets
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

NAMES = ["anna", "bob", "clara", "dev", "emil", "fatou", "gus", "hana"]
PLACES = ["paris", "lagos", "oslo", "lima", "quito", "hanoi"]
WORDS = ["the", "went", "to", "saw", "met", "in", "and", "a", "friend", "walked", "from", "home", "today", "later"]
NER_TAGS = ["O", "B-PER", "B-LOC"]
#: The toy translation: every source word has one target word (a fixed shuffle of the vocabulary).
TARGET = {w: "x" + w[::-1] for w in WORDS + NAMES + PLACES}
SPLITS = {"train": (96, 1), "validation": (24, 2), "test": (16, 3)}


def _sentence(rng: random.Random) -> tuple[list[str], list[int]]:
    words, tags = [], []
    for _ in range(rng.randint(3, 9)):
        kind = rng.random()
        word, tag = ((rng.choice(NAMES), 1) if kind < 0.2 else (rng.choice(PLACES), 2) if kind < 0.35
                     else (rng.choice(WORDS), 0))
        words.append(word)
        tags.append(tag)
    return words, tags


def load_dataset(task: str, scale: int = 1) -> datasets.DatasetDict:
    """The raw splits of `task`: "ner" (`tokens`, `ner_tags`), "text" (`text`), "translation"
    (`translation`: {"src": ..., "tgt": ...}), "summarization" (`document`, `summary`: its first
    three words, the lead baseline) or "swag", as the Hub's datasets lay them out;
    `scale` times the usual number of rows (benchmarks)."""
    splits = {}
    for split, (n, seed) in SPLITS.items():
        rng = random.Random(seed)
        rows = [_sentence(rng) for _ in range(n * scale)]
        if task == "ner":
            splits[split] = {"tokens": [w for w, _ in rows], "ner_tags": [t for _, t in rows]}
        elif task == "text":
            splits[split] = {"text": [" ".join(w) for w, _ in rows]}
        elif task == "translation":
            splits[split] = {"translation": [{"src": " ".join(w), "tgt": " ".join(TARGET[x] for x in w)}
                                             for w, _ in rows]}
        elif task == "summarization":
            splits[split] = {"document": [" ".join(w) for w, _ in rows],
                             "summary": [" ".join(w[:3]) for w, _ in rows]}
        elif task == "swag":
            splits[split] = _swag(rows, rng)
        elif task == "qa":
            splits[split] = _squad(rows, rng, split)
        else:
            raise ValueError(f"task={task!r}: use 'ner', 'text', 'translation', 'summarization', 'swag' or 'qa'")
    return datasets.DatasetDict({k: datasets.Dataset.from_dict(v) for k, v in splits.items()})


def _swag(rows: list[tuple[list[str], list[int]]], rng: random.Random) -> dict[str, list]:
    """SWAG's columns: a context (`sent1`), the start of the next sentence (`sent2`), four
    endings and the `label` of the right one, which names a place of the context and ends with
    "home" or "today"."""
    columns: dict[str, list] = {"sent1": [], "sent2": [], "label": [], **{f"ending{i}": [] for i in range(4)}}
    for words, _ in rows:
        place = next((w for w in words if w in PLACES), rng.choice(PLACES))
        others = rng.sample([p for p in PLACES if p != place], 3)
        label = rng.randrange(4)
        endings = others[:label] + [place] + others[label:]
        columns["sent1"].append(" ".join(words))
        columns["sent2"].append(f"{rng.choice(NAMES)} {rng.choice(['went', 'walked'])}")
        columns["label"].append(label)
        for i, ending in enumerate(endings):
            last = rng.choice(["home", "today"] if i == label else ["later", "from", "and"])
            columns[f"ending{i}"].append(f"to {ending} {last}")
    return columns


def _squad(rows: list[tuple[list[str], list[int]]], rng: random.Random, split: str) -> dict[str, list]:
    """SQuAD's columns: `id`, `question`, `context` and `answers` ({"text", "answer_start"}):
    who went where, the answer a name of the context followed by a place."""
    columns: dict[str, list] = {"id": [], "question": [], "context": [], "answers": []}
    for i, (words, _) in enumerate(rows):
        name, place = rng.choice(NAMES), rng.choice(PLACES)
        context = " ".join(words[:3] + [name, "went", "to", place] + words[3:])
        answer = f"{name} went to {place}" if rng.random() < 0.3 else place
        columns["id"].append(f"{split}-{i}")
        columns["question"].append(f"where did {name} go" if answer == place else "who went where")
        columns["context"].append(context)
        before = words[:3] + ([] if answer != place else [name, "went", "to"])  # (a sentence has 3 words or more)
        columns["answers"].append({"text": [answer], "answer_start": [len(" ".join(before)) + 1]})
    return columns


def squad_scores(predictions: dict[str, str], references: dict[str, list[str]]) -> dict[str, float]:
    """SQuAD's `exact_match` and `f1` in percent: per question the best over its answers, the
    F1 over the shared words (lower-cased, split on spaces)."""
    def f1(pred: str, ref: str) -> float:
        p, r = pred.lower().split(), ref.lower().split()
        common = sum((collections.Counter(p) & collections.Counter(r)).values())
        return 0.0 if not common else 2 * common / (len(p) + len(r))

    exact = [max(float(predictions[k].lower() == a.lower()) for a in refs) for k, refs in references.items()]
    overlap = [max(f1(predictions[k], a) for a in refs) for k, refs in references.items()]
    return {"exact_match": 100 * sum(exact) / len(exact), "f1": 100 * sum(overlap) / len(overlap)}


def make_tokenizer(template: str = "bert") -> PreTrainedTokenizerFast:
    """A word-level tokenizer over every word of the toy data. `template`: "bert" wraps a text as
    `[CLS] ... [SEP]` (a pair as `[CLS] A [SEP] B [SEP]`, B's token type 1), "t5" ends it with
    `</s>`, "gpt2" adds nothing."""
    vocab = sorted(set(WORDS + NAMES + PLACES + list(TARGET.values())))
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["[PAD]", "</s>", "[UNK]", "[CLS]", "[SEP]"]
    tok.train_from_iterator([" ".join(vocab)], trainers.WordLevelTrainer(special_tokens=specials))
    ids = {s: tok.token_to_id(s) for s in specials}
    if template == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
    elif template == "t5":
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", ids["</s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="</s>",
                                   cls_token="[CLS]", sep_token="[SEP]")


def corpus_bleu(predictions: list[str], references: list[str], order: int = 4) -> float:
    """Corpus BLEU in percent (sacrebleu's `score` without its smoothing and tokenizer): the
    n-gram precisions of the whole corpus, their geometric mean and the brevity penalty."""
    matches, totals = [0] * order, [0] * order
    pred_len = ref_len = 0
    for pred, ref in zip(predictions, references):
        p, r = pred.split(), ref.split()
        pred_len, ref_len = pred_len + len(p), ref_len + len(r)
        for n in range(1, order + 1):
            p_grams = collections.Counter(tuple(p[i:i + n]) for i in range(len(p) - n + 1))
            r_grams = collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            matches[n - 1] += sum((p_grams & r_grams).values())
            totals[n - 1] += max(len(p) - n + 1, 0)
    if pred_len == 0 or min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / order
    brevity = 1.0 if pred_len > ref_len else math.exp(1 - ref_len / pred_len)
    return 100 * brevity * math.exp(log_precision)


def entity_scores(predictions: list[list[str]], references: list[list[str]]) -> dict[str, float]:
    """seqeval's overall scores for single-token entities: precision, recall and F1 of the
    non-"O" tags, and the accuracy of every tag."""
    pairs = [(p, r) for ps, rs in zip(predictions, references) for p, r in zip(ps, rs)]
    hit = sum(p == r != "O" for p, r in pairs)
    predicted, actual = sum(p != "O" for p, _ in pairs), sum(r != "O" for _, r in pairs)
    precision, recall = hit / max(predicted, 1), hit / max(actual, 1)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"overall_precision": precision, "overall_recall": recall, "overall_f1": f1,
            "overall_accuracy": sum(p == r for p, r in pairs) / max(len(pairs), 1)}


def _lcs(a: list[str], b: list[str]) -> int:
    """The length of the longest common subsequence of two word lists."""
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal, row[0] = 0, 0
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_scores(predictions: list[str], references: list[str]) -> dict[str, float]:
    """ROUGE-1, ROUGE-2 and ROUGE-L F-measures averaged over the pairs (what `evaluate`'s "rouge"
    returns with whitespace tokens and no stemming), in [0, 1]."""
    def f_measure(hits: int, predicted: int, actual: int) -> float:
        if not hits:
            return 0.0
        precision, recall = hits / predicted, hits / actual
        return 2 * precision * recall / (precision + recall)

    totals = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    for pred, ref in zip(predictions, references):
        p, r = pred.split(), ref.split()
        for n, key in ((1, "rouge1"), (2, "rouge2")):
            p_grams = collections.Counter(tuple(p[i:i + n]) for i in range(len(p) - n + 1))
            r_grams = collections.Counter(tuple(r[i:i + n]) for i in range(len(r) - n + 1))
            totals[key] += f_measure(sum((p_grams & r_grams).values()), max(len(p) - n + 1, 0), max(len(r) - n + 1, 0))
        totals["rougeL"] += f_measure(_lcs(p, r), len(p), len(r))
    return {key: value / max(len(predictions), 1) for key, value in totals.items()}
