"""The tiny chat data set that kubetune ships: short, varied, deterministic English conversations.

The local run (``kubetune run examples/tiny-local.yaml --local``) and the CPU tests fine-tune on it;
the tiny tokenizer (:mod:`kubetune_trainer.tiny`) is trained on it. Every conversation is made here
from small hand-written tables with a seeded generator, so the file is the same on every machine
and nothing is downloaded. The facts are simple and regular on purpose: a tiny random model can
learn them in a few hundred CPU steps, so a falling loss is a real signal.

    python -m kubetune_trainer.tiny_data --out examples/data/tiny-chat.jsonl   # regenerate the file
    python -m kubetune_trainer.tiny_data --preference --out examples/data/tiny-preference.jsonl

The preference pairs (:func:`preference_pairs`, for DPO and ORPO) ask the same questions; the chosen
answer is the right one, the rejected one a right answer to another question of the same kind ("3 plus
4 is 9."), so the words are all the tokenizer's and only the preference is new.

>>> rows = conversations(count=3, seed=0)
>>> [m["role"] for m in rows[0]["messages"]][-2:]
['user', 'assistant']
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DEFAULT_COUNT = 320
DEFAULT_SEED = 1234
FILE_NAME = "tiny-chat.jsonl"
PREFERENCE_FILE_NAME = "tiny-preference.jsonl"
PREFERENCE_COUNT = 160

_NUMBER_WORDS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen", "twenty",
]  # fmt: skip
_COLORS = {
    "banana": "yellow", "grass": "green", "snow": "white", "coal": "black", "a tomato": "red",
    "the sky": "blue", "an orange": "orange", "a plum": "purple", "chocolate": "brown", "a lemon": "yellow",
    "a cloud": "white", "a leaf": "green", "a cherry": "red", "the sea": "blue", "a crow": "black",
}  # fmt: skip
_OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "up": "down", "happy": "sad", "light": "dark",
    "open": "closed", "early": "late", "full": "empty", "old": "new", "hard": "soft", "long": "short",
    "wet": "dry", "loud": "quiet", "high": "low",
}  # fmt: skip
_SOUNDS = {
    "dog": "woof", "cat": "meow", "cow": "moo", "duck": "quack", "sheep": "baa", "owl": "hoot",
    "horse": "neigh", "lion": "roar", "frog": "ribbit", "bee": "buzz", "mouse": "squeak", "pig": "oink",
}  # fmt: skip
_CAPITALS = {
    "France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Japan": "Tokyo", "Egypt": "Cairo",
    "Kenya": "Nairobi", "Peru": "Lima", "Canada": "Ottawa", "Norway": "Oslo", "Greece": "Athens",
    "Chile": "Santiago", "Ireland": "Dublin", "Portugal": "Lisbon", "Poland": "Warsaw", "India": "New Delhi",
}  # fmt: skip
_WORDS = [
    "cat", "sun", "tree", "book", "fish", "moon", "rain", "lamp", "bird", "door", "milk", "star",
    "ship", "cake", "road", "wind",
]  # fmt: skip
_SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a friendly assistant. Answer in one short sentence.",
    "You are a concise assistant.",
]
_GREETINGS = [
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi there.", "Hi! What would you like to know?"),
    ("Good morning!", "Good morning! How can I help?"),
    ("Thanks for your help.", "You are welcome. Have a nice day!"),
    ("Who are you?", "I am a small assistant trained by kubetune."),
]


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 10), rng.randint(0, 10)
    q = rng.choice(["What is {a} plus {b}?", "Add {a} and {b}.", "How much is {a} + {b}?"])
    return q.format(a=a, b=b), f"{a} plus {b} is {a + b}."


def _subtract(rng: random.Random) -> tuple[str, str]:
    a = rng.randint(0, 20)
    b = rng.randint(0, a)
    q = rng.choice(["What is {a} minus {b}?", "Subtract {b} from {a}."])
    return q.format(a=a, b=b), f"{a} minus {b} is {a - b}."


def _number_word(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(0, 20)
    return f"How do you write {n} in words?", f"{n} is written as {_NUMBER_WORDS[n]}."


def _color(rng: random.Random) -> tuple[str, str]:
    thing, color = rng.choice(sorted(_COLORS.items()))
    q = rng.choice(["What color is {t}?", "Tell me the color of {t}."])
    return q.format(t=thing), f"{thing[0].upper()}{thing[1:]} is {color}."


def _opposite(rng: random.Random) -> tuple[str, str]:
    word, other = rng.choice(sorted(_OPPOSITES.items()))
    if rng.random() < 0.5:
        word, other = other, word
    return f"What is the opposite of {word}?", f"The opposite of {word} is {other}."


def _sound(rng: random.Random) -> tuple[str, str]:
    animal, sound = rng.choice(sorted(_SOUNDS.items()))
    q = rng.choice(["What sound does a {a} make?", "What does a {a} say?"])
    return q.format(a=animal), f"A {animal} says {sound}."


def _capital(rng: random.Random) -> tuple[str, str]:
    country, city = rng.choice(sorted(_CAPITALS.items()))
    q = rng.choice(["What is the capital of {c}?", "Name the capital city of {c}."])
    return q.format(c=country), f"The capital of {country} is {city}."


def _spell(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(_WORDS)
    return f"Spell the word {word}.", f"{word} is spelled {'-'.join(word)}."


def _count(rng: random.Random) -> tuple[str, str]:
    start = rng.randint(1, 10)
    end = start + rng.randint(2, 5)
    return f"Count from {start} to {end}.", ", ".join(str(i) for i in range(start, end + 1)) + "."


def _reverse(rng: random.Random) -> tuple[str, str]:
    words = rng.sample(_WORDS, 3)
    return f"Reverse these words: {' '.join(words)}.", f"Reversed: {' '.join(reversed(words))}."


def _greeting(rng: random.Random) -> tuple[str, str]:
    return rng.choice(_GREETINGS)


_KINDS: list[Callable[[random.Random], tuple[str, str]]] = [
    _add, _subtract, _number_word, _color, _opposite, _sound, _capital, _spell, _count, _reverse, _greeting,
]  # fmt: skip


def conversations(count: int = DEFAULT_COUNT, seed: int = DEFAULT_SEED) -> list[dict[str, Any]]:
    """``count`` chat rows ``{"messages": [...]}``; the same for the same seed, on every machine."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for _ in range(count):
        messages: list[dict[str, str]] = []
        if rng.random() < 0.3:
            messages.append({"role": "system", "content": rng.choice(_SYSTEM_PROMPTS)})
        # Mostly one turn, sometimes two or three: multi-turn rows exercise assistant-only masking.
        turns = rng.choices([1, 2, 3], weights=[6, 3, 1])[0]
        for _turn in range(turns):
            question, answer = rng.choice(_KINDS)(rng)
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": answer})
        rows.append({"messages": messages})
    return rows


def preference_pairs(
    count: int = PREFERENCE_COUNT, seed: int = DEFAULT_SEED, *, conversational: bool = True
) -> list[dict[str, Any]]:
    """``count`` rows ``{"prompt", "chosen", "rejected"}``: chat turns (``conversational``) or strings.
    Greetings are left out: their few answers make too many pairs with no wrong one."""
    rng = random.Random(seed)
    kinds = [k for k in _KINDS if k is not _greeting]
    rows: list[dict[str, Any]] = []
    while len(rows) < count:
        kind = rng.choice(kinds)
        question, answer = kind(rng)
        wrong = next((a for _, a in (kind(rng) for _ in range(20)) if a != answer), None)
        if wrong is None:
            continue
        if conversational:
            rows.append(
                {
                    "prompt": [{"role": "user", "content": question}],
                    "chosen": [{"role": "assistant", "content": answer}],
                    "rejected": [{"role": "assistant", "content": wrong}],
                }
            )
        else:
            rows.append(
                {"prompt": f"Question: {question}\nAnswer:", "chosen": f" {answer}", "rejected": f" {wrong}"}
            )
    return rows


def write_jsonl(rows: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def read_texts(path: Path) -> list[str]:
    """Every message text in a chat JSONL file (or every file in a folder), for tokenizer training."""
    files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
    texts: list[str] = []
    for file in files:
        for line in file.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                texts.extend(m["content"] for m in row.get("messages", []))
                texts.extend(str(row[k]) for k in ("text", "prompt", "completion") if k in row)
    return texts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kubetune_trainer.tiny_data", description=__doc__.split("\n")[0]
    )
    p.add_argument("--out", type=Path, required=True, help="JSONL file to write")
    p.add_argument("--count", type=int, default=DEFAULT_COUNT)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--preference", action="store_true", help="preference pairs (DPO, ORPO) instead of chats")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.preference:
        count = args.count if args.count != DEFAULT_COUNT else PREFERENCE_COUNT
        path = write_jsonl(preference_pairs(count, args.seed), args.out)
        print(f"wrote {count} preference pairs to {path}")
        return 0
    path = write_jsonl(conversations(args.count, args.seed), args.out)
    print(f"wrote {args.count} conversations to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
