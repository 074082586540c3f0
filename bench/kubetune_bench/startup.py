"""``kubetune bench --startup``: what the preparation step saves a restart, and the estimate against
the measured speed and memory (issue 22's benchmark).

``restart``: in one run, side by side, on the same Hub-named model and data served over the Hub's
protocol from 127.0.0.1 (the stand-in of ``tests/support/hub.py``; run from the repository root):

* BEFORE: a fresh trainer process (``python -m kubetune_trainer.train``) on the FineTuneJob example
  ``qwen3-4b-full.yaml`` with an empty HF cache: it downloads the model and data and tokenizes in
  the process;
* PREPARE: ``python -m kubetune_trainer.prepare`` on the same config, on the CPU (no GPU visible);
* AFTER: a fresh trainer process on the prepared volume with ``HF_HUB_OFFLINE=1`` (a restart).

Each trainer process is timed from its start to the end of its first optimizer step: the line the
trainer prints for step 1 (``logging_first_step``: the logs dict with ``'loss'``), then killed
(SIGKILL: a SIGTERM would save a checkpoint). Each has its own empty torch.compile caches, as a
restarted pod has. The model: Qwen3-4B-shaped random weights saved with ``save_pretrained``
(safetensors, bf16); the tokenizer: a byte-level BPE trained with ``tokenizers`` on the synthetic
text with a realistic vocabulary (32,000 by default; Qwen's own is 151,643), a ChatML template; the
data: Capybara-like multi-turn conversations (:func:`.workload.capybara_like_lengths` tokens each,
text of pseudo-words whose tokens per word is measured on the tokenizer) as a JSON-lines data set.
``--smoke``: the same on the tiny model on the CPU.

``scaling``: ``prepare()`` alone (in this process, on this machine's CPU) for 1k/4k/16k
conversations, with a tiny tokenizer (1,024 tokens) and the realistic one.

``estimate``: :func:`kubetune_trainer.plan.estimate.estimate` for the kubetune cases' own configs (the
examples on one GPU of the machine's product) against the case results in ``--out``
(``kubetune bench --cases qwen2-0.5b:kubetune,qwen3-4b:kubetune`` first, into the same folder).
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .cases import MAX_LENGTH, MODEL_CONFIGS, example_path, max_length_of
from .workload import scaled_lengths

MODEL_REPO = "bench/qwen3-4b-random"
DATA_REPO = "bench/capybara-like"
REALISTIC_VOCAB = 32_000
TINY_VOCAB = 1024
SCALING_COUNTS = (1000, 4000, 16000)
TEMPLATE_TOKENS = 5  # ChatML's tokens around a message
# the trainer's line for an optimizer step's logs (logging_first_step: step 1 is logged)
FIRST_STEP = re.compile(r"['\"]loss['\"]\s*:")
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"


@dataclass(frozen=True)
class StartupOptions:
    """One ``--startup`` call: where, which model, how many conversations and steps."""

    out: Path
    model: str  # "qwen3-4b" on a GPU, "tiny" for the CPU smoke
    conversations: int
    steps: int
    vocab: int = REALISTIC_VOCAB
    gpus: int = 1
    timeout: float = 300.0  # each process
    examples: Path | None = None


@dataclass
class Timed:
    """One process: seconds to the end of its first optimizer step, and in all."""

    name: str
    first_step_seconds: float | None
    seconds: float
    exit_code: int | None
    hub_requests: int = 0
    log: str = ""


@dataclass
class StartupResult:
    model: str
    conversations: int
    vocab: int
    device: str
    before: Timed
    prepare: Timed
    after: Timed
    report: dict[str, Any] = field(default_factory=dict)
    assets_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        b, a = self.before.first_step_seconds, self.after.first_step_seconds
        return round(b / a, 2) if a and b else None


# --- the data ---------------------------------------------------------------------------------------


def lexicon(size: int = 40_000, *, seed: int = 0) -> list[str]:
    """Pseudo-words of 1-4 syllables (a Zipf-ranked vocabulary, most frequent first)."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr"]
    nuclei = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    codas = ["", "", "n", "r", "s", "t", "l", "nd", "ng"]
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        syllables = rng.choices([1, 2, 3, 4], weights=[4, 5, 3, 1])[0]
        word = "".join(rng.choice(onsets) + rng.choice(nuclei) + rng.choice(codas) for _ in range(syllables))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


class TextMaker:
    """Sentences of Zipf-distributed pseudo-words and punctuation, ``n`` words at a time."""

    def __init__(self, seed: int = 0) -> None:
        self.words = lexicon(seed=seed)
        self.cum = list(_cumulative([1.0 / (rank + 1) for rank in range(len(self.words))]))
        self.rng = random.Random(seed + 1)

    def text(self, n: int) -> str:
        words = self.rng.choices(self.words, cum_weights=self.cum, k=max(1, n))
        out = []
        for i, word in enumerate(words):
            out.append(word.capitalize() if i == 0 or words[i - 1].endswith(".") else word)
            if self.rng.random() < 0.08:
                out[-1] += self.rng.choice([".", ".", ",", ",", "?", ":"])
        return " ".join(out) + "."


def _cumulative(values: list[float]) -> list[float]:
    total, out = 0.0, []
    for v in values:
        total += v
        out.append(total)
    return out


def conversation(maker: TextMaker, rng: random.Random, tokens: int, words_per_token: float) -> dict[str, Any]:
    """One multi-turn chat of about ``tokens`` tokens under the chat template: 1-4 user/assistant
    pairs, the answers longer."""
    turns = rng.choices([1, 2, 3, 4], weights=[5, 3, 1, 1])[0]
    # the template's own tokens (ChatML: about 5 a message) come out of the length
    words = max(8, round((tokens - TEMPLATE_TOKENS * 2 * turns) * words_per_token))
    per_turn = max(4, words // turns)
    messages = []
    for _ in range(turns):
        asked = max(2, round(per_turn * rng.uniform(0.1, 0.35)))
        messages.append({"role": "user", "content": maker.text(asked)})
        messages.append({"role": "assistant", "content": maker.text(max(2, per_turn - asked))})
    return {"messages": messages}


def conversation_lengths(n: int, *, seed: int, max_length: int) -> list[int]:
    """Token lengths of Capybara-like conversations: at maxLength 1024 the benchmark's log-normal
    (median 850, 39% at or above 1024) without its cut at 1024 (the tail goes on to 16k tokens,
    as a raw data set's does: preparation tokenizes all of it); a shorter maxLength (the tiny
    smoke): the benchmark's scaled lengths, cut there."""
    if max_length != MAX_LENGTH:
        return scaled_lengths(n, seed=seed, max_length=max_length)
    rng = random.Random(seed)
    mu = math.log(850.0)
    sigma = (math.log(MAX_LENGTH) - mu) / 0.2793  # as workload.capybara_like_lengths
    return [max(16, min(16 * MAX_LENGTH, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def write_conversations(
    path: Path, n: int, *, words_per_token: float, max_length: int, seed: int = 0
) -> list[int]:
    """``n`` conversations of Capybara-like token lengths as JSON lines; their target lengths."""
    lengths = conversation_lengths(n, seed=seed, max_length=max_length)
    maker, rng = TextMaker(seed), random.Random(seed + 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for length in lengths:
            f.write(json.dumps(conversation(maker, rng, length, words_per_token)) + "\n")
    return lengths


# --- the tokenizer and the model --------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab: int) -> Any:
    """A byte-level BPE (like Qwen's) with ``vocab`` tokens, a ChatML template, pad/eos set."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from kubetune_trainer.sources.chat import CHATML_TEMPLATE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[ENDOFTEXT, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    scaffold = [f"{IM_START}{role}\n" for role in ("system", "user", "assistant")]
    tok.train_from_iterator(texts + scaffold * 50, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHATML_TEMPLATE,
        model_max_length=40960,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


def tokenizer_for(vocab: int, *, seed: int = 0, sample: int = 600) -> tuple[Any, float]:
    """The tokenizer trained on ``sample`` conversations' text, and its words per token on fresh text."""
    maker = TextMaker(seed)
    texts = [maker.text(400) for _ in range(sample)]
    tokenizer = train_tokenizer(texts, vocab)
    probe = TextMaker(seed)  # the same words, other sentences
    probe.rng = random.Random(seed + 7)
    held_out = [probe.text(400) for _ in range(50)]
    tokens = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in held_out)
    words = sum(len(t.split()) for t in held_out)
    return tokenizer, words / tokens


def save_model(folder: Path, model: str, tokenizer: Any, device: str) -> Path:
    """Random weights of ``model``'s published shape (bf16, safetensors) and the tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = dict(MODEL_CONFIGS[model])
    if model == "tiny":
        conf["vocab_size"] = len(tokenizer)
    conf.update(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    config = AutoConfig.for_model(**conf)
    torch.manual_seed(0)
    with torch.device(device):
        net = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    net.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del net
    return folder


# --- the configs and the processes ------------------------------------------------------------------


def startup_config(options: StartupOptions, output_dir: Path, *, model: str, data: str, hub: bool) -> Path:
    """The Qwen3-4B full example pointed at the benchmark's model and data (Hub names when ``hub``),
    ``steps`` optimizer steps, no checkpoint before the end; written beside ``output_dir``."""
    from kubetune_api.trainer_config import load_manifest, resolve

    job = load_manifest(example_path("kubetune-full", options.examples))
    spec = job.spec.model_copy(deep=True)
    if hub:
        spec.model.name, spec.model.path, spec.model.revision = model, None, "main"
        spec.dataset.name, spec.dataset.path = data, None
    else:
        spec.model.name, spec.model.path = None, model
        spec.dataset.name, spec.dataset.path = None, data
    spec.training.epochs, spec.training.max_steps = None, options.steps
    spec.training.save_steps, spec.training.eval_steps = 10**6, 10**6
    spec.training.max_length = max_length_of(options.model)
    if options.model == "tiny":  # the smoke's short conversations: the template's share is larger
        spec.preparation.max_truncated_fraction = 0.9
    spec.resources.gpus_per_node = options.gpus
    spec.resources.gpu_product = gpu_product() if options.gpus else None
    job.spec = spec
    cfg = resolve(job, output_dir=str(output_dir))
    path = output_dir.with_name(output_dir.name + ".yaml")
    path.write_text(cfg.to_yaml())
    return path


def gpu_product() -> str:
    """The GPU as its ``nvidia.com/gpu.product`` label names it (this machine's, else an H200)."""
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NVIDIA H200"
    return name.replace(" ", "-")


def process_env(home: Path, cache: Path, *, endpoint: str | None, offline: bool, cpu: bool) -> dict[str, str]:
    """A pod's environment: its own empty HF home and compile caches; the Hub or none."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE"))}
    for name in ("MLFLOW_TRACKING_URI", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update(
        PYTHONUNBUFFERED="1",
        HF_HOME=str(home),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
        TRITON_CACHE_DIR=str(cache / "triton"),
    )
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    if offline:
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def timed_process(
    name: str, cmd: list[str], env: dict[str, str], log: Path, *, timeout: float, first_step: bool
) -> Timed:
    """Run ``cmd``; with ``first_step``, the time of the trainer's step-1 line, then SIGKILL it."""
    started = time.monotonic()
    seen: list[float] = []
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                now = time.monotonic() - started
                out.write(f"[{now:8.2f}] {line}")
                out.flush()
                if first_step and not seen and FIRST_STEP.search(line):
                    seen.append(now)
                    os.killpg(proc.pid, signal.SIGKILL)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        reader.join(timeout=10)
    seconds = time.monotonic() - started
    if seen:
        code = 0  # killed by us at the first step's end
    return Timed(name, round(seen[0], 2) if seen else None, round(seconds, 2), code, log=str(log))


def trainer_cmd(config: Path) -> list[str]:
    return [sys.executable, "-m", "kubetune_trainer.train", "--config", str(config), "--no-progress-bar"]


def prepare_cmd(config: Path) -> list[str]:
    return [sys.executable, "-m", "kubetune_trainer.prepare", "--config", str(config)]


# --- restart: before, prepare, after ----------------------------------------------------------------


def _hub() -> Any:
    try:
        from tests.support.hub import HubStandIn
    except ImportError as e:  # not in the repository root
        raise SystemExit(
            "kubetune bench --startup serves the model and data with tests/support/hub.py: run it from "
            "the repository root"
        ) from e
    return HubStandIn


def build_assets(options: StartupOptions, work: Path, device: str) -> tuple[Path, Path, dict[str, float]]:
    """The model folder and the data set folder the Hub stand-in serves, and how long each took."""
    spent: dict[str, float] = {}
    t0 = time.monotonic()
    tokenizer, words_per_token = tokenizer_for(options.vocab)
    spent["tokenizer"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    model_dir = save_model(work / "hub-model", options.model, tokenizer, device)
    spent["model"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    data_dir = work / "hub-data"
    write_conversations(
        data_dir / "data" / "train-00000-of-00001.jsonl",
        options.conversations,
        words_per_token=words_per_token,
        max_length=max_length_of(options.model),
    )
    spent["data"] = round(time.monotonic() - t0, 1)
    return model_dir, data_dir, spent


def run_restart(options: StartupOptions) -> StartupResult:
    """BEFORE, PREPARE and AFTER, one after the other, on the same model and data."""
    import torch

    work = options.out / "startup-work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    device = "cuda" if options.gpus and torch.cuda.is_available() else "cpu"
    model_dir, data_dir, spent = build_assets(options, work, device)
    if device == "cuda":
        torch.cuda.empty_cache()
    hub = _hub()(work / "hub")
    try:
        hub.add_model(MODEL_REPO, model_dir)
        hub.add_dataset(DATA_REPO, data_dir)
        cfg_before = startup_config(options, work / "before", model=MODEL_REPO, data=DATA_REPO, hub=True)
        cfg_volume = startup_config(options, work / "volume", model=MODEL_REPO, data=DATA_REPO, hub=True)

        def env(name: str, *, offline: bool = False, cpu: bool = False) -> dict[str, str]:
            return process_env(
                work / f"hf-{name}", work / f"cache-{name}", endpoint=hub.endpoint, offline=offline, cpu=cpu
            )

        runs = []
        for name, cmd, environ, first in (
            ("before", trainer_cmd(cfg_before), env("before"), True),
            ("prepare", prepare_cmd(cfg_volume), env("prepare", cpu=True), False),
            ("after", trainer_cmd(cfg_volume), env("after", offline=True), True),
        ):
            mark = hub.request_count()
            timed = timed_process(
                name,
                [*cmd, "--termination-log", str(work / f"{name}.termination-log")],
                environ,
                options.out / f"startup-{name}.log",
                timeout=options.timeout,
                first_step=first,
            )
            timed.hub_requests = len(hub.requests_since(mark))
            print(f"[startup] {name}: {timed}", flush=True)
            runs.append(timed)
    finally:
        hub.stop()
    report_path = work / "volume" / "prepared" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    before, prepared, after = runs
    result = StartupResult(
        options.model, options.conversations, options.vocab, name, before, prepared, after, report, spent
    )
    shutil.rmtree(work, ignore_errors=True)
    return result


def restart_table(r: StartupResult) -> str:
    """The markdown table of one restart run."""
    lines = [
        "| phase | seconds to the end of the first optimizer step | process seconds | Hub requests | exit |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for t in (r.before, r.prepare, r.after):
        first = f"{t.first_step_seconds:.1f}" if t.first_step_seconds is not None else "—"
        lines.append(f"| {t.name} | {first} | {t.seconds:.1f} | {t.hub_requests} | {t.exit_code} |")
    ratio = f"{r.ratio}x" if r.ratio else "n/a"
    data = r.report.get("data") or {}
    lines.append(
        f"\nBEFORE/AFTER (to the end of step 1): **{ratio}** ({r.model}, {r.conversations:,} conversations, "
        f"{data.get('tokens', 0):,} training tokens, median {data.get('lengthP50', '?')} tokens, "
        f"{100 * float(data.get('truncatedFraction', 0)):.0f}% cut at maxLength; tokenizer {r.vocab:,} tokens; "
        f"{r.device}). Preparation's own clock: {r.report.get('seconds')} s. Assets built in {r.assets_seconds} s."
    )
    return "\n".join(lines) + "\n"


# --- scaling: prepare() alone, by examples and tokenizer --------------------------------------------


def run_scaling(
    out: Path,
    counts: tuple[int, ...] = SCALING_COUNTS,
    vocabs: tuple[int, ...] = (TINY_VOCAB, REALISTIC_VOCAB),
) -> list[dict[str, Any]]:
    """``prepare()`` in this process on a tiny model with each tokenizer, for each conversation count."""
    from kubetune_api.trainer_config import TrainerConfig
    from kubetune_trainer.preparation.prepare import prepare

    rows = []
    for vocab in vocabs:
        work = out / f"scaling-{vocab}"
        shutil.rmtree(work, ignore_errors=True)
        tokenizer, words_per_token = tokenizer_for(vocab)
        model = save_model(work / "model", "tiny", tokenizer, "cpu")
        for n in counts:
            data = work / f"data-{n}.jsonl"
            write_conversations(data, n, words_per_token=words_per_token, max_length=1024)
            options = StartupOptions(out=out, model="qwen3-4b", conversations=n, steps=3, vocab=vocab, gpus=0)
            cfg = startup_config(options, work / f"volume-{n}", model=str(model), data=str(data), hub=False)
            started = time.monotonic()
            report = prepare(TrainerConfig.load(cfg))
            seconds = time.monotonic() - started
            row = {
                "vocab": vocab,
                "conversations": n,
                "seconds": round(seconds, 1),
                "tokens": report.data.tokens + 0,
                "length_p50": report.data.length_p50,
                "examples_per_second": round(n / seconds, 1),
            }
            print(f"[startup] scaling: {row}", flush=True)
            rows.append(row)
        shutil.rmtree(work, ignore_errors=True)
    return rows


def scaling_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| tokenizer (tokens) | conversations | prepare() s | training tokens | median length | conversations/s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['vocab']:,} | {r['conversations']:,} | {r['seconds']:.1f} | {r['tokens']:,} | {r['length_p50']} "
            f"| {r['examples_per_second']:.0f} |"
        )
    return "\n".join(lines) + "\n"


# --- estimate against measured ----------------------------------------------------------------------

ESTIMATED_CASES = {"qwen2-0.5b:kubetune": "kubetune-lora", "qwen3-4b:kubetune": "kubetune-full"}


def estimate_for(case: str, *, rows: int, steps: int, product: str, examples: Path | None = None) -> Any:
    """The estimate for a kubetune case's own config (its example on one GPU of ``product``), on the
    statistics of the case's synthetic data (``rows`` conversations)."""
    import tempfile

    from kubetune_api.preparation import DataStats
    from kubetune_trainer.plan import estimate as estimating
    from kubetune_trainer.plan.plan import shape_from_config

    from .runners import kubetune_config

    model, kind = case.split(":", maxsplit=1)[0], ESTIMATED_CASES[case]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = kubetune_config(kind, tmp, tmp, steps, tmp, examples=examples)
    cfg.spec.resources.gpu_product = product
    cut = max_length_of(model)
    lengths = sorted(scaled_lengths(rows, seed=0, max_length=cut))
    data = DataStats(
        train_examples=rows,
        tokens=sum(lengths),
        length_p50=lengths[len(lengths) // 2],
        length_p95=lengths[int(0.95 * (len(lengths) - 1))],
        length_max=lengths[-1],
        truncated_fraction=sum(1 for n in lengths if n >= cut) / rows,
        loss_token_fraction=1.0,
    )
    return estimating.estimate(cfg, shape_from_config(MODEL_CONFIGS[model]), data)


def estimate_rows(out: Path, *, rows: int, steps: int, examples: Path | None = None) -> list[dict[str, Any]]:
    """Each estimated case beside its measured result in ``out`` (``<case>.json``), when there is one."""
    table = []
    for case in ESTIMATED_CASES:
        path = out / f"{case.replace(':', '_')}.json"
        measured = json.loads(path.read_text()) if path.is_file() else None
        device = (measured or {}).get("device") or "NVIDIA H200"
        est = estimate_for(case, rows=rows, steps=steps, product=device.replace(" ", "-"), examples=examples)
        row: dict[str, Any] = {"case": case, "estimate": est.wire(), "measured": None}
        if measured:
            tps, peak = measured["tokens_per_second"], measured.get("peak_memory_gib")
            row["measured"] = {
                "tokens_per_second": tps,
                "peak_memory_gib": peak,
                "device": device,
                "plan": measured.get("plan") or {},
                "steps_measured": measured.get("steps_measured"),
            }
            row["tokens_per_second_error"] = round(est.tokens_per_second / tps - 1, 3) if tps else None
            row["peak_memory_error"] = round(est.peak_memory_gib / peak - 1, 3) if peak else None
        table.append(row)
    return table


def estimate_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| case (1 GPU) | micro-step (estimate; measured) | estimated tokens/s | measured tokens/s | error "
        "| estimated peak GiB | measured peak GiB | error |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def pct(value: Any) -> str:
        return f"{100 * value:+.1f}%" if value is not None else "—"

    for r in rows:
        e, m = r["estimate"], r["measured"] or {}
        mtps = f"{m['tokens_per_second']:,.0f}" if m.get("tokens_per_second") else "—"
        mpeak = f"{m['peak_memory_gib']:.1f}" if m.get("peak_memory_gib") else "—"
        plan = m.get("plan") or {}
        layout = (
            f"{e['microBatchRows']} rows x {e['gradientAccumulationSteps']}"
            f"{', recompute' if e['gradientCheckpointing'] else ''}; "
            + (
                f"{plan.get('per_device_batch_size')} rows x {plan.get('gradient_accumulation_steps')}"
                f"{', recompute' if plan.get('gradient_checkpointing') else ''}"
                if plan
                else "—"
            )
        )
        lines.append(
            f"| {r['case']} ({e['gpuProduct']}) | {layout} | {e['tokensPerSecond']:,.0f} | {mtps} | {pct(r.get('tokens_per_second_error'))} "
            f"| {e['peakMemoryGib']:.1f} | {mpeak} | {pct(r.get('peak_memory_error'))} |"
        )
    return "\n".join(lines) + "\n"


# --- the command ------------------------------------------------------------------------------------


def run_from_args(args: Any) -> int:
    """``kubetune bench --startup restart,scaling,estimate``: each part asked, written into ``--out``."""
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    parts = [p for p in str(args.startup).split(",") if p]
    unknown = set(parts) - {"restart", "scaling", "estimate"}
    if unknown:
        print(
            f"--startup: unknown part(s) {sorted(unknown)}; known: restart, scaling, estimate",
            file=sys.stderr,
        )
        return 2
    results: dict[str, Any] = {}
    text: dict[str, str] = {}
    if "restart" in parts:
        smoke = bool(args.smoke)
        options = StartupOptions(
            out=out,
            model="tiny" if smoke else "qwen3-4b",
            conversations=args.rows or (200 if smoke else 16_000),
            steps=args.steps or 3,
            vocab=TINY_VOCAB if smoke else REALISTIC_VOCAB,
            gpus=0 if smoke else 1,
            examples=args.examples,
        )
        restart = run_restart(options)
        results["restart"] = {**asdict(restart), "ratio": restart.ratio}
        text["restart"] = restart_table(restart)
    if "scaling" in parts:
        counts = (
            tuple(int(n) for n in os.environ.get("KUBETUNE_BENCH_SCALING", "").split(",") if n)
            or SCALING_COUNTS
        )
        results["scaling"] = run_scaling(out, counts)
        text["scaling"] = scaling_table(results["scaling"])
    if "estimate" in parts:
        rows = args.rows if args.rows and "restart" not in parts else 1500
        results["estimate"] = estimate_rows(out, rows=rows, steps=6, examples=args.examples)
        text["estimate"] = estimate_table(results["estimate"])
    for part, data in results.items():  # each part its own files: parts asked in other calls stay
        (out / f"startup-{part}.json").write_text(json.dumps(data, indent=2))
        (out / f"startup-{part}.md").write_text(text[part])
        print(text[part])
    failed = "restart" in results and results["restart"]["after"]["first_step_seconds"] is None
    return 1 if failed else 0
