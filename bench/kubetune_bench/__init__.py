"""Benchmark: the notebooks' configurations against kubetune's defaults, side by side in one run.

    kubetune bench --out bench-out                     # on a GPU: Qwen2-0.5B LoRA and Qwen3-4B full
    kubetune bench --smoke --out bench-out             # CPU smoke: the tiny model, a few steps
    kubetune bench --cases qwen3-4b:kubetune --memory-cap-gib 80
    kubetune bench --cases qwen2-0.5b:notebook-a,qwen2-0.5b:kubetune --notebook-memory  # + held to A's memory

Each case trains the same model (built from its published config with random weights: nothing
is downloaded) on the same synthetic chat data for a few optimizer steps and measures the steps
after the warm-up:

* ``notebook-a`` / ``notebook-b``: TRL's SFTTrainer configured exactly as the notebook does
  (A: fp32 weights + fp16 autocast, batch 8 x accumulation 4, gradient checkpointing, Liger,
  padded batches; B: bf16 weights, batch 1 x accumulation 8, gradient checkpointing, padded);
* ``kubetune``: the real trainer's own functions (``plan.make_plan``, ``train.build_model``'s
  dtype/attention choice, ``train.build_sft_config``, ``train.build_trainer``) on the notebook's
  FineTuneJob example (examples/*.yaml; ``--examples`` names another folder) with its defaults (bf16, padding-free packing with the
  varlen kernel, Liger fused kernels, checkpointing only when the memory plan needs it).

Metrics per case: training tokens/s (real tokens only: no padding), optimizer-step time, peak GPU
memory, and MFU = model FLOPs per second / peak dense bf16 FLOP/s of the GPU, where model FLOPs per
token = m * 2 * N_matmul + a * 4 * L * H * d_head * c (on N GPUs: over N peaks): N_matmul the parameters of every matrix
multiply (LM head included, embeddings excluded), c the mean attended context per token (causal:
(n+1)/2 for an example of n tokens), m = 3 for full fine-tuning and 2 for LoRA (frozen weights get
no weight gradients), a = 3. Recomputation from gradient checkpointing is not counted (model FLOPs,
not hardware FLOPs).

Data: conversations whose token lengths follow a log-normal fitted to Capybara's (median ~850,
cut at 1024, ~39% at the cap), pre-tokenized with uniform random ids over the model's vocabulary.

Each case runs in its own process (Liger patches classes; memory must start empty); results are
written as JSON, a markdown table and a PNG chart.

The modules: ``cases`` (the models, the notebooks' settings, the case table, a result, a job),
``workload`` (data and FLOPs), ``runners`` (one case in its process; ``CaseOptions`` and the public
``CaseHooks`` for diagnostics), ``measure`` (tokens and step times), ``gpu_profile`` (``--profile``),
``jobs`` (the processes of a call), ``report`` (ratios, table, chart) and ``cli`` (the options).
A tool of the repository, shipped in the wheel beside the CLI; the trainer image does not carry it.
"""
