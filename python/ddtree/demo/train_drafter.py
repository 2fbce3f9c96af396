"""Train the demo's DFlash drafter (`dflash.py`) on the target's own outputs, reproducibly:

    python -m ddtree.demo.train_drafter --device cuda --out DIR [--minutes 9] [--seed 0]

(the defaults are the shipped drafter's recipe: weights/README.md).

1. Data: chat prompts built here (stories, explanations, lists, code, arithmetic, rewriting;
   every tenth held out) and the target's own responses to them, decoded hundreds at a time
   (`datagen`): per training prompt one greedy response and ``--samples`` − 1 that branch
   off greedy (each token, with probability ``--branch``, a draw at ``--temperature``); then
   each sequence's tapped hidden states and the target's argmax after every prefix (the
   labels) from one prefill. No download; a fixed seed gives the same data. With
   ``--responses FILE`` the decoded responses are written to FILE, or read from it when it
   exists, so runs of other drafter shapes, taps or losses start from the same data without
   decoding it again (``--responses-only`` stops after writing it).
2. Training (DFlash's recipe): random anchor positions per sequence, the block after each
   anchor predicted at once, cross-entropy weighted by exp(-i / gamma) over block position
   i, AdamW, linear warmup then cosine decay, gradient clipping. The target stays frozen.
   With ``--soft W`` the cross-entropy is against (1 − W) of the target's argmax and W of
   its whole next-token distribution (distillation: a tree ranks the draft's runners-up too).
3. Checkpoints: ``DIR/checkpoint/`` holds the weights and the optimizer's moments in shards of
   at most 15 MB (what one device call brings back) and ``state.json``; a later run with the
   same ``--out`` resumes there. ``DIR/drafter.safetensors`` holds the weights alone in bf16, with
   their config, seed, data size and held-out acceptance, of the evaluated step with the best
   held-out acceptance (a small drafter memorises its data: the last step is rarely best).

The held-out estimate is chain acceptance: per anchor, 1 + the leading block positions whose
argmax is the target's token. With each new best step the record also holds what decoding
the held-out responses greedily gets, rounds walked from each response's start:
``held_out_decode`` (tokens a round of a chain, lower than the per-position mean) and
``held_out_tree`` (tokens a round of DDTree at each ``--tree-budgets`` B, trees built by
``ddtree.build_tree`` from the drafter's logits).
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import shutil
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import ddtree

from . import datagen, dflash

SHARD_BYTES = 15 * 2**20
BRANCHING = datagen.Policy(branch=0.2, temperature=1.0)  # the sampled copies' default
# The shipped drafter's taps: three spread over the stack, so that two layers fit in 16 MB.
SHIPPED_TAPS = (1, 14, 27)

TOPICS = (
    "a lighthouse keeper", "the moon", "a lost robot", "volcanoes", "a bakery", "the ocean",
    "bees", "a train journey", "winter", "a library", "dragons", "the internet", "rainbows",
    "a football match", "photosynthesis", "a city at night", "friendship", "the desert",
    "a chess game", "electricity", "a garden", "the stars", "a birthday", "mountains",
    "recycling", "a cat", "the wind", "a museum", "music", "a river",
    "a thunderstorm", "coffee", "an old map", "the human heart", "a space station", "bicycles",
    "a haunted house", "gravity", "a market day", "penguins", "the printing press", "a snowman",
    "a detective", "magnets", "a pirate ship", "the rainforest", "a school play", "clouds",
    "a time machine", "honey", "a violin", "earthquakes", "a farmer", "the Roman Empire",
    "a kite", "vaccines", "a treehouse", "the solar system", "a baker's apprentice", "owls",
    "a snow day", "bridges", "a secret garden", "the pyramids", "a marathon", "tea",
    "a submarine", "autumn leaves", "a wizard", "batteries", "a circus", "coral reefs",
    "a night train", "the alphabet", "a first job", "tigers", "a paper airplane", "glaciers",
    "an inventor", "the water cycle", "a village fair", "robots in factories", "a quiet morning",
    "sharks", "a spelling bee", "the telescope", "a camping trip", "chocolate", "a castle",
    "wind turbines", "a postcard", "the brain", "a jazz band", "a lemon tree", "fireflies",
    "a broken clock", "the Olympics", "a fox", "a bus stop", "mushrooms", "a school garden",
    "satellites", "a rainy afternoon", "the Silk Road", "elephants", "a lighthouse storm",
    "bread", "a robot chef", "the northern lights", "a spider", "a small boat", "maps",
    "a violin maker", "deserts at night", "a windmill", "the first computer", "a puppy",
    "a winter market", "sunflowers", "a sailor", "migration of birds", "a toy shop",
)  # fmt: skip
TEMPLATES = (
    "Tell me a short story about {t}.",
    "Explain {t} to a child in a few sentences.",
    "List five facts about {t}.",
    "Write a poem about {t}.",
    "Write a Python function that prints three sentences about {t}.",
    "Give me three tips related to {t}, as a numbered list.",
    "Rewrite this sentence in a formal tone: I really like {t} a lot.",
    "Describe {t} in one paragraph.",
    "Write a short dialogue between two friends about {t}.",
    "What are the pros and cons of {t}? Answer briefly.",
    "Summarize what you know about {t} in three bullet points.",
    "Write a haiku about {t}.",
    "Write a diary entry from the point of view of someone who loves {t}.",
    "Ask me three quiz questions about {t}, with the answers.",
    "Write a product description for a toy inspired by {t}.",
    "Explain how {t} could be used in a science lesson.",
)
SUMS = tuple(f"What is {a} plus {b}? Show your steps." for a, b in
             ((17, 25), (134, 78), (9, 99), (250, 375), (61, 39), (88, 12), (345, 667),
              (23, 58), (1200, 845), (77, 77), (406, 95), (13, 987), (560, 440), (31, 69),
              (702, 298), (45, 55), (818, 181), (99, 1), (150, 275), (64, 36)))  # fmt: skip


def prompts() -> list[str]:
    """The training and held-out prompts, in a fixed order."""
    return [tpl.format(t=t) for t in TOPICS for tpl in TEMPLATES] + list(SUMS)


def split(texts: list) -> tuple[list, list]:
    """(training, held out): every tenth item is held out."""
    return [x for i, x in enumerate(texts) if i % 10], texts[::10]


@dataclass
class Data:
    """Sequences padded to one length: tokens [N, T], tapped hidden states [N, T, k*H],
    labels [N, T] (the target's argmax after tokens 0..t-1, the greedy choice for position
    t), lengths [N] and where each response starts [N]."""

    tokens: torch.Tensor
    taps: torch.Tensor
    labels: torch.Tensor
    lengths: torch.Tensor
    starts: torch.Tensor
    # The target's final normed hidden state [N, T, H] (for a distillation loss), or None.
    final: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def take(self, idx: torch.Tensor) -> Data:
        final = None if self.final is None else self.final[idx]
        return Data(self.tokens[idx], self.taps[idx], self.labels[idx], self.lengths[idx],
                    self.starts[idx], final)  # fmt: skip


def generate(target, prompt_ids: list[list[int]], cfg: dflash.DraftConfig, max_new: int,
             bs: int = 256, seed: int = 0, samples: int = 1,
             policy: datagen.Policy = BRANCHING, log=None, final=False) -> Data:  # fmt: skip
    """The target's responses to `prompt_ids` (`respond_all`), annotated (`annotated`), by
    one engine on the target's device."""
    engine = data_engine(target, prompt_ids, max_new)
    seqs, starts = respond_all(engine, prompt_ids, max_new, bs, seed, samples, policy, log)
    return annotated(engine, cfg, seqs, starts, final)


def data_engine(target, prompt_ids: list[list[int]], max_new: int):
    """The engine that decodes and annotates the responses to `prompt_ids` (its RoPE tables
    reach the longest prompt plus `max_new`; made once: it fuses the target's weights)."""
    return datagen.engine_for(target, max(map(len, prompt_ids)) + max_new)


def respond_all(engine, prompt_ids: list[list[int]], max_new: int, bs: int = 256,
                seed: int = 0, samples: int = 1, policy: datagen.Policy = BRANCHING,
                log=None) -> tuple[list[list[int]], list[int]]:  # fmt: skip
    """(sequences, where each response starts): `datagen.respond` on `bs` prompts at once,
    one greedy response per prompt and ``samples`` − 1 more that follow `policy`; `log`
    gets a line per copy."""
    t0 = time.perf_counter()
    g = torch.Generator(engine.device).manual_seed(seed)
    eos = engine.cfg.eos_id
    seqs, starts = [], []
    for copy in range(samples):
        pol = policy if copy else datagen.Policy()
        for i in range(0, len(prompt_ids), bs):
            chunk = prompt_ids[i : i + bs]
            out = datagen.respond(engine, chunk, max_new, eos, pol, g)
            seqs += [p + t for p, t in zip(chunk, out, strict=True)]
            starts += [len(p) for p in chunk]
        if log:
            made = sum(len(x) - n for x, n in zip(seqs, starts, strict=True))
            log(f"copy {copy + 1}/{samples}: {len(seqs)} responses, {made} tokens "
                f"({time.perf_counter() - t0:.0f} s)")  # fmt: skip
    return seqs, starts


def annotated(engine, cfg: dflash.DraftConfig, seqs: list[list[int]], starts: list[int],
              final=False) -> Data:  # fmt: skip
    """`seqs` with each one's tapped hidden states and labels (`datagen.annotate`, and with
    `final` the target's final hidden states)."""
    device, dtype, hidden = engine.device, engine.w.embed.dtype, engine.cfg.hidden
    tokens = datagen.padded(seqs, device)
    lengths = list(map(len, seqs))
    n, width = tokens.shape
    taps = torch.zeros(n, width, len(cfg.taps) * hidden, dtype=dtype, device=device)
    labels = torch.full((n, width), -100, dtype=torch.int64, device=device)
    last = torch.zeros(n, width, hidden, dtype=dtype, device=device) if final else None
    datagen.annotate(engine, tokens, lengths, cfg.taps, taps, labels, last)
    return Data(tokens, taps, labels, torch.tensor(lengths, device=device),
                torch.tensor(starts, device=device), last)  # fmt: skip


def cut(data: Data, tokens: int | None) -> Data:
    """`data` with each response cut after its first `tokens` tokens (None: whole). The
    responses are greedy, so a cut one is what decoding only that many would give."""
    if tokens is None:
        return data
    lengths = torch.minimum(data.lengths, data.starts + tokens)
    return Data(data.tokens, data.taps, data.labels, lengths, data.starts, data.final)


# The responses a run generates, as a file that other runs (other drafter shapes, taps or
# losses; the same prompts, lengths, seed and sampling) can start from instead of decoding
# again: the decode is most of the data's time, the annotation a few seconds.
def responses_key(args) -> dict:
    return {
        "prompts": args.prompts,
        "max_new_tokens": args.max_new_tokens,
        "seed": args.seed,
        "samples": args.samples,
        "branch": args.branch,
        "temperature": args.temperature,
    }


def save_responses(path: pathlib.Path, key: dict, parts: dict, seconds: float) -> None:
    """`parts` {name: (sequences, starts)} into `path` (written beside it, then renamed)."""
    out = {"key": json.dumps(key, sort_keys=True), "seconds": seconds}
    for name, (seqs, starts) in parts.items():
        out[f"{name}.flat"] = torch.tensor([t for s in seqs for t in s], dtype=torch.int32)
        out[f"{name}.lengths"] = torch.tensor(list(map(len, seqs)), dtype=torch.int64)
        out[f"{name}.starts"] = torch.tensor(starts, dtype=torch.int64)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(out, tmp)
    tmp.rename(path)


def load_responses(path: pathlib.Path, key: dict) -> tuple[dict, float]:
    """({name: (sequences, starts)}, the seconds their decode took) from `save_responses`;
    ValueError when `path` was made with other generation flags than `key`."""
    got = torch.load(path, weights_only=True)
    if got["key"] != json.dumps(key, sort_keys=True):
        raise ValueError(f"responses: {path} was generated with {got['key']}, not "
                         f"{json.dumps(key, sort_keys=True)}")  # fmt: skip
    parts = {}
    for name in {k.split(".")[0] for k in got if k.endswith(".flat")}:
        flat = got[f"{name}.flat"].tolist()
        ends = got[f"{name}.lengths"].cumsum(0).tolist()
        seqs = [flat[a:b] for a, b in zip([0] + ends[:-1], ends, strict=True)]
        parts[name] = (seqs, got[f"{name}.starts"].tolist())
    return parts, got["seconds"]


def anchors(data: Data, per_seq: int, block: int, g: torch.Generator) -> torch.Tensor:
    """`per_seq` random anchors [N, A] per sequence, each in the response (from its first
    token's predecessor) with at least one token after it."""
    lo = (data.starts - 1).clamp(min=1).unsqueeze(1)
    hi = (data.lengths - 1).unsqueeze(1)  # exclusive: anchor + 1 must be a real token
    u = torch.rand(len(data), per_seq, generator=g, device="cpu").to(lo.device)
    return (lo + (u * (hi - lo).clamp(min=1)).long()).clamp(max=hi - 1)


def targets(data: Data, at: torch.Tensor, block: int) -> torch.Tensor:
    """The label of the position after each block position [N, A, L] (the target's greedy
    choice there); -100 past a sequence's end."""
    pos = at.unsqueeze(2) + 1 + torch.arange(block, device=at.device)
    ok = pos < data.lengths.view(-1, 1, 1)
    tok = data.labels.gather(1, pos.clamp(max=data.labels.shape[1] - 1).flatten(1))
    return torch.where(ok, tok.view_as(pos), -100)


def loss_of(w, cfg, embed, data: Data, at: torch.Tensor, gamma: float,
            soft: float = 0.0) -> torch.Tensor:  # fmt: skip
    """DFlash's loss: cross-entropy per block position, weighted by exp(-i / gamma). With
    `soft` > 0 the cross-entropy is against a mix: (1 − soft) of the target's argmax and
    `soft` of its whole next-token distribution there (distillation; needs `data.final`)."""
    logits = dflash.block_logits(w, cfg, embed, data.taps.to(embed.dtype), data.tokens, at)
    want = targets(data, at, cfg.block)
    ce = F.cross_entropy(logits.flatten(0, 2), want.flatten(), reduction="none",
                         ignore_index=-100).view_as(want)  # fmt: skip
    if soft > 0:
        ce = (1 - soft) * ce + soft * soft_ce(logits, data, at, embed)
    weight = torch.exp(-torch.arange(cfg.block, device=ce.device) / gamma) * (want >= 0)
    return (ce * weight).sum() / weight.sum().clamp(min=1)


def soft_ce(logits: torch.Tensor, data: Data, at: torch.Tensor, embed) -> torch.Tensor:
    """Cross-entropy [N, A, L] of the draft `logits` against the target's next-token
    distribution at each block position's label (the target's final hidden state one
    position before it, times the tied embedding)."""
    pos = (at.unsqueeze(2) + torch.arange(logits.shape[2], device=at.device)).clamp(
        max=data.final.shape[1] - 1)  # fmt: skip
    n, a, L = pos.shape
    h = data.final.gather(1, pos.view(n, a * L, 1).expand(-1, -1, data.final.shape[2]))
    want = (h.to(embed.dtype) @ embed.T).log_softmax(-1).view(n, a, L, -1)
    return -(want.exp() * logits.log_softmax(-1)).sum(-1)


@torch.no_grad()
def depth_profile(w, cfg, embed, data: Data, per_seq: int, seed: int) -> list[float]:
    """Held-out, per depth d = 1..L: the share of anchors whose first d block positions'
    argmax are the target's greedy tokens (what a chain of depth d would accept)."""
    g = torch.Generator().manual_seed(seed)
    at = anchors(data, per_seq, cfg.block, g)
    logits = dflash.block_logits(w, cfg, embed, data.taps.to(embed.dtype), data.tokens, at)
    right = (logits.argmax(-1) == targets(data, at, cfg.block)).long()
    return right.cumprod(-1).float().mean((0, 1)).tolist()


def acceptance(w, cfg, embed, data: Data, per_seq: int, seed: int) -> float:
    """Held-out chain acceptance: 1 + the leading block positions whose argmax is right."""
    return 1 + sum(depth_profile(w, cfg, embed, data, per_seq, seed))


def chain_accepts(
    logits: torch.Tensor, labels: torch.Tensor, pos: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """Tokens a greedy verify of each request's chain commits [bs]: 1 + the leading block
    positions of the draft `logits` [bs, L, V] rooted at `pos` whose argmax is the target's
    greedy token there (``labels[pos + 1 + i]``, inside the sequence)."""
    at = pos.unsqueeze(1) + 1 + torch.arange(logits.shape[1], device=pos.device)
    want = labels.gather(1, at.clamp(max=labels.shape[1] - 1))
    right = (logits.argmax(-1) == want) & (at < lengths.unsqueeze(1))
    return 1 + right.long().cumprod(-1).sum(-1)


def tree_accepts(tree, labels: torch.Tensor, pos: torch.Tensor, lengths: torch.Tensor):
    """Tokens a greedy verify of each request's `tree` commits [bs]: 1 + the depth of the
    deepest node whose path from the root is the target's greedy text (node at depth d
    rooted at position p: right when it is ``labels[p + d]``, inside the sequence)."""
    q = tree.verify_ids.shape[1]
    at = pos.unsqueeze(1) + tree.depths
    valid = (torch.arange(q, device=pos.device) <= tree.num_nodes.unsqueeze(1)) & (
        at < lengths.unsqueeze(1)
    )
    want = labels.gather(1, at.clamp(max=labels.shape[1] - 1))
    match = valid & (tree.verify_ids == want)
    on = torch.zeros_like(match)
    on[:, 0] = True
    for d in range(1, int(tree.depths.max()) + 1):  # parents sit one level up
        on |= (tree.depths == d) & match & on.gather(1, tree.parents.clamp(min=0))
    return 1 + (tree.depths * on).amax(1)


@torch.no_grad()
def decode_rounds(w, cfg, embed, data: Data, commit) -> float:
    """Held-out tokens a round of greedy decoding, as the demo's decoders get them on these
    (greedy) responses: from each response's first root, every round drafts at its root,
    `commit(logits [bs, L, V], roots, pos, part)` says how many tokens the target's greedy
    text accepts, and the next round starts after them. The sequences take their rounds
    side by side. Lower than the mean over every position (`acceptance`): a decode starts
    more of its rounds where the drafter is weak, since a strong round covers several."""
    pos, end = data.starts.clone(), data.lengths - 1
    tokens = rounds = 0
    while True:
        live = (pos < end).nonzero().flatten()
        if live.numel() == 0:
            return tokens / max(rounds, 1)
        part, p = data.take(live), pos[live]
        logits = dflash.block_logits(w, cfg, embed, part.taps.to(embed.dtype), part.tokens,
                                     p.unsqueeze(1))[:, 0]  # fmt: skip
        roots = part.tokens.gather(1, p.unsqueeze(1)).squeeze(1)
        a = commit(logits, roots, p, part)
        tokens, rounds = tokens + int(a.sum()), rounds + live.numel()
        pos[live] = p + a


def decode_acceptance(w, cfg, embed, data: Data) -> float:
    """`decode_rounds` of a chain: the draft's argmax at each depth."""
    return decode_rounds(w, cfg, embed, data, lambda logits, roots, p, part: chain_accepts(
        logits, part.labels, p, part.lengths))  # fmt: skip


def tree_decode_acceptance(w, cfg, embed, data: Data, budget: int) -> float:
    """`decode_rounds` of DDTree with `budget`-node trees (`ddtree.build_tree`)."""

    def commit(logits, roots, p, part):
        tree = ddtree.build_tree(logits, roots, p, budget=budget)
        return tree_accepts(tree, part.labels, p, part.lengths)

    return decode_rounds(w, cfg, embed, data, commit)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))


class Trainer:
    """AdamW over the drafter's weights (fp32 masters) with the schedule of `lr_at`."""

    def __init__(self, w: dflash.DraftWeights, cfg, embed, steps: int, peak=6e-4, seed=0,
                 moments_dtype=torch.float32, soft: float = 0.0):  # fmt: skip
        self.w, self.cfg, self.embed, self.soft = w, cfg, embed, soft
        # Checkpoints keep Adam's moments in this dtype (bf16 halves what a device call
        # must bring back; float32 resumes bit for bit on the CPU).
        self.moments_dtype = moments_dtype
        self.params = w.parameters()
        for p in self.params:
            p.requires_grad_(True)
        self.opt = torch.optim.AdamW(self.params, lr=peak, betas=(0.9, 0.95), weight_decay=0.01)
        self.steps, self.peak, self.warmup = steps, peak, max(steps // 20, 1)
        self.step = 0
        self.g = torch.Generator().manual_seed(seed)

    def train_step(self, data: Data, batch: int, per_seq: int, gamma: float) -> float:
        idx = torch.randint(0, len(data), (batch,), generator=self.g).to(data.tokens.device)
        part = data.take(idx)
        at = anchors(part, per_seq, self.cfg.block, self.g)
        for group in self.opt.param_groups:
            group["lr"] = lr_at(self.step, self.steps, self.peak, self.warmup)
        loss = loss_of(self.w, self.cfg, self.embed, part, at, gamma, self.soft)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.step += 1
        return float(loss.detach())

    # Checkpoints: the weights and the optimizer's moments as named tensors, in shards.
    def tensors(self) -> dict[str, torch.Tensor]:
        # The sampler's state too: a resumed run draws the batches the straight one would.
        out = {"rng": self.g.get_state()}
        out.update({f"w.{k}": v.detach() for k, v in self.w.tensors().items()})
        for i, p in enumerate(self.params):
            for key, value in self.opt.state.get(p, {}).items():
                moment = key != "step"
                out[f"opt.{i}.{key}"] = value.to(self.moments_dtype) if moment else value
        return out

    def save(self, folder: pathlib.Path, extra: dict) -> None:
        """Into `folder`, replaced whole: written beside it first, so that a run stopped
        while saving leaves the previous checkpoint."""
        final, folder = folder, folder.with_name(folder.name + ".tmp")
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        shard, size, n = {}, 0, 0
        for name, t in self.tensors().items():
            if shard and size + t.numel() * t.element_size() > SHARD_BYTES:
                torch.save(shard, folder / f"shard_{n:02d}.pt")
                shard, size, n = {}, 0, n + 1
            shard[name] = t.cpu()
            size += t.numel() * t.element_size()
        torch.save(shard, folder / f"shard_{n:02d}.pt")
        (folder / "state.json").write_text(json.dumps({**extra, "step": self.step}))
        shutil.rmtree(final, ignore_errors=True)
        folder.rename(final)

    def load(self, folder: pathlib.Path) -> dict:
        state = json.loads((folder / "state.json").read_text())
        named = {}
        for f in sorted(folder.glob("shard_*.pt")):
            named.update(torch.load(f, weights_only=True))
        self.g.set_state(named["rng"])
        with torch.no_grad():
            for k, p in self.w.tensors().items():
                p.copy_(named[f"w.{k}"])
        for i, p in enumerate(self.params):
            # AdamW keeps its step counts on the host (not capturable): they stay there.
            moments = {k.split(".", 2)[2]: v if k.endswith(".step") else v.to(p.device, p.dtype)
                       for k, v in named.items() if k.startswith(f"opt.{i}.")}  # fmt: skip
            if moments:
                self.opt.state[p] = moments
        self.step = state["step"]
        return state


def save_weights(path: pathlib.Path, w, cfg, record: dict) -> None:
    """The drafter alone as a safetensors file, bf16, with its config and how it was trained
    (JSON in the metadata's ``ddtree`` entry)."""
    from . import safetensors_io

    tensors = {k: v.detach().to(torch.bfloat16) for k, v in w.tensors().items()}
    meta = {"layers": cfg.layers, "block": cfg.block, "taps": list(cfg.taps), **record}
    safetensors_io.save(path, tensors, {"ddtree": json.dumps(meta)})


def load_weights(path, target_cfg, device=None, dtype=None):
    """(DraftWeights, DraftConfig, meta) of a `save_weights` file."""
    from . import safetensors_io

    tensors, metadata = safetensors_io.load(path)
    meta = json.loads(metadata["ddtree"])
    cfg = dflash.DraftConfig(target_cfg, meta["layers"], meta["block"], tuple(meta["taps"]))
    w = dflash.DraftWeights.from_tensors(tensors, cfg.layers).to(device, dtype)
    return w, cfg, meta


def draft_block(path) -> int:
    """The block size (the draft depth) of a `save_weights` file, from its header alone."""
    from . import safetensors_io

    return int(json.loads(safetensors_io.metadata(path)["ddtree"])["block"])


def responses(engine, args, train_ids, held_ids, log) -> tuple[dict, float]:
    """({"train", "held"}: (sequences, starts)), the seconds their decode took): read from
    ``args.responses`` when that file exists, else decoded (and written there if given)."""
    key = responses_key(args)
    path = pathlib.Path(args.responses) if args.responses else None
    if path is not None and path.exists():
        parts, seconds = load_responses(path, key)
        log(f"responses read from {path} (their decode took {seconds:.0f} s)")
        return parts, seconds
    t0 = time.perf_counter()
    policy = datagen.Policy(args.branch, args.temperature)
    parts = {
        "train": respond_all(engine, train_ids, args.max_new_tokens, args.gen_batch, args.seed,
                             args.samples, policy, log),
        "held": respond_all(engine, held_ids, args.max_new_tokens, args.gen_batch,
                            args.seed + 1),
    }  # fmt: skip
    seconds = time.perf_counter() - t0
    if path is not None:
        save_responses(path, key, parts, seconds)
    return parts, seconds


def train(target, tok, args, log=print) -> dict:
    """The whole job (data, then steps until `args.steps`, `args.minutes` of training or
    `args.total_minutes` since the job began), resumable, with fp32 matmuls at
    `args.matmul_precision` (torch's setting, restored after). A caller that set torch's
    per-backend precisions instead keeps them (torch cannot report one setting then)."""
    try:
        before = torch.get_float32_matmul_precision()
    except RuntimeError:
        before = None
    if before is not None:
        torch.set_float32_matmul_precision(args.matmul_precision)
    try:
        return train_at_precision(target, tok, args, log)
    finally:
        if before is not None:
            torch.set_float32_matmul_precision(before)


def train_at_precision(target, tok, args, log) -> dict:
    job_start = time.perf_counter()
    device = torch.device(args.device)
    if not 0 <= args.soft <= 1:
        raise ValueError(f"soft: must be in [0, 1], got {args.soft}")
    if args.held_out_tokens is not None and args.held_out_tokens < 1:
        raise ValueError(f"held_out_tokens: must be at least 1, got {args.held_out_tokens}")
    if args.responses_only and not args.responses:
        raise ValueError("responses_only: needs --responses, the file to write")
    cfg = dflash.DraftConfig(target.config, args.layers, args.block, tuple(args.taps))
    texts = prompts()[: args.prompts]
    train_ids, held_ids = ([tok.chat(p) for p in part] for part in split(texts))
    engine = data_engine(target, train_ids + held_ids, args.max_new_tokens)
    parts, gen_s = responses(engine, args, train_ids, held_ids, log)
    if args.responses_only:
        log(f"responses written to {args.responses} ({gen_s:.0f} s); --responses-only: done")
        return {"data_seconds": round(gen_s, 1)}
    t0 = time.perf_counter()
    data = annotated(engine, cfg, *parts["train"], final=args.soft > 0)
    held = cut(annotated(engine, cfg, *parts["held"]), args.held_out_tokens)
    del engine  # its fused copy of the target's weights
    # The data's time: its decode (perhaps by an earlier run) and this annotation.
    gen_s += time.perf_counter() - t0
    tokens = int((data.lengths - data.starts).sum())
    log(f"data: {len(data)} sequences ({tokens} response tokens), {len(held)} held out, "
        f"{gen_s:.0f} s")  # fmt: skip
    w = dflash.DraftWeights.init(cfg, args.seed).to(device)
    embed = target.embed.float()  # the frozen LM head, fp32 beside the fp32 master weights
    moments = getattr(torch, args.checkpoint_moments)
    trainer = Trainer(w, cfg, embed, args.steps, args.lr, args.seed, moments, args.soft)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"seed": args.seed, "sequences": len(data), "response_tokens": tokens,
              "samples": args.samples, "branch": args.branch,
              "temperature": args.temperature, "soft": args.soft,
              "data_seconds": round(gen_s, 1),
              "matmul_precision": args.matmul_precision}  # fmt: skip
    if args.held_out_tokens is not None:
        record["held_out_tokens"] = args.held_out_tokens
    if (out / "checkpoint" / "state.json").exists():
        state = trainer.load(out / "checkpoint")
        # The time spent, and which step the weights file holds (a resumed run replaces it
        # only with a better one).
        kept = ("train_seconds", "best_held_out", "held_out_acceptance", "best_step",
                "held_out_by_depth", "held_out_decode", "held_out_tree")  # fmt: skip
        for key in kept:
            if key in state:
                record[key] = state[key]
        log(f"resumed at step {trainer.step}")
    spent = record.get("train_seconds", 0.0)
    best = record.get("best_held_out", 0.0)  # the weights file holds the best so far
    start = saved = time.perf_counter()
    total = args.total_minutes
    deadline = math.inf if total is None else job_start + 60 * total

    def more() -> bool:
        now = time.perf_counter()
        return trainer.step < args.steps and now - start < 60 * args.minutes and now < deadline

    while more():
        loss = trainer.train_step(data, args.batch, args.anchors, args.gamma)
        now = spent + time.perf_counter() - start
        if time.perf_counter() - saved > 60 * args.save_minutes:  # a run cut short keeps it
            trainer.save(out / "checkpoint", {**record, "train_seconds": now})
            saved = time.perf_counter()
        if trainer.step % args.every == 0 or trainer.step == args.steps:
            profile = depth_profile(w, cfg, embed, held, args.anchors, args.seed)
            tau = 1 + sum(profile)
            log(f"step {trainer.step}/{args.steps}: loss {loss:.3f}, held-out acceptance "
                f"{tau:.2f} ({time.perf_counter() - start:.0f} s)")  # fmt: skip
            if tau > best:  # the drafter memorises: keep the step that generalised best
                best = record["best_held_out"] = record["held_out_acceptance"] = tau
                record["best_step"] = trainer.step
                record["held_out_by_depth"] = [round(x, 4) for x in profile]
                record["held_out_decode"] = round(decode_acceptance(w, cfg, embed, held), 4)
                record["held_out_tree"] = {
                    str(b): round(tree_decode_acceptance(w, cfg, embed, held, b), 4)
                    for b in args.tree_budgets
                }
                log(
                    f"  new best: tokens a round decoding the held-out responses: chain "
                    f"{record['held_out_decode']:.2f}, DDTree B = "
                    + ", ".join(f"{b} {v:.2f}" for b, v in record["held_out_tree"].items())
                )
                mark = {"train_seconds": now, "step": trainer.step}
                save_weights(out / "drafter.safetensors", w, cfg, {**record, **mark})
    record["train_seconds"] = spent + time.perf_counter() - start
    record["step"] = trainer.step
    trainer.save(out / "checkpoint", record)
    if best == 0.0:  # no evaluation ran: the last weights
        record["held_out_acceptance"] = acceptance(w, cfg, embed, held, args.anchors, 1234)
        save_weights(out / "drafter.safetensors", w, cfg, record)
    log(f"{out / 'drafter.safetensors'} holds the best held-out step; run: {json.dumps(record)}")
    return record


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddtree.demo.train_drafter", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--out", required=True, help="folder of the checkpoint and drafter.safetensors")
    p.add_argument("--device", default="cuda", help="default: cuda")
    p.add_argument("--layers", type=int, default=2, help="draft layers (default: 2)")
    p.add_argument("--block", type=int, default=8, help="block size L (default: 8)")
    p.add_argument("--taps", type=lambda t: tuple(int(x) for x in t.split(",")),
                   default=SHIPPED_TAPS, help="target layers read, 0-based (default: "
                   f"{','.join(map(str, SHIPPED_TAPS))}; DFlash's five for a 30-layer target, "
                   f"{','.join(map(str, dflash.TAPS_30))}, make two layers too large)")  # fmt: skip
    p.add_argument("--prompts", type=int, default=len(prompts()),
                   help=f"prompts used (default: all {len(prompts())})")  # fmt: skip
    p.add_argument("--max-new-tokens", type=int, default=256, help="default: 256")
    p.add_argument("--samples", type=int, default=12,
                   help="responses per training prompt: one greedy, the rest branching "
                   "(default: 12)")  # fmt: skip
    p.add_argument("--branch", type=float, default=BRANCHING.branch,
                   help="a branching response's chance per token of a draw instead of the "
                   "argmax (default: 0.2)")  # fmt: skip
    p.add_argument("--temperature", type=float, default=BRANCHING.temperature,
                   help="temperature of those draws (default: 1.0)")  # fmt: skip
    p.add_argument("--gen-batch", type=int, default=512,
                   help="prompts decoded at once while generating (default: 512)")  # fmt: skip
    p.add_argument("--responses", default=None,
                   help="a file of the target's responses: read when it exists (made with "
                   "the same generation flags), else written after decoding them")  # fmt: skip
    p.add_argument(
        "--responses-only",
        action="store_true",
        help="stop once the responses are decoded and written to --responses",
    )
    p.add_argument("--steps", type=int, default=16000, help="default: 16000")
    p.add_argument("--minutes", type=float, default=9.0,
                   help="stop training after (default: 9)")  # fmt: skip
    p.add_argument("--total-minutes", type=float, default=None,
                   help="stop training this long after the job began, data included, with "
                   "its checkpoint and record written (a time limit's safe margin; default: "
                   "none)")  # fmt: skip
    p.add_argument("--batch", type=int, default=64, help="sequences per step (default: 64)")
    p.add_argument("--anchors", type=int, default=16, help="anchors per sequence (default: 16)")
    p.add_argument("--gamma", type=float, default=4.0, help="loss decay (default: 4)")
    p.add_argument("--soft", type=float, default=0.0,
                   help="weight of the target's whole next-token distribution in the loss, "
                   "against its argmax (distillation; default: 0)")  # fmt: skip
    p.add_argument("--matmul-precision", choices=["highest", "high"], default="high",
                   help="fp32 matmuls: high lets them run as TF32 (CUDA's tensor cores, "
                   "and oneDNN on CPUs that have it; default: high)")  # fmt: skip
    p.add_argument("--lr", type=float, default=6e-4, help="peak learning rate (default: 6e-4)")
    p.add_argument("--held-out-tokens", type=int, default=128,
                   help="judge the held-out responses on their first N tokens (default: 128; "
                   "--max-new-tokens or more judges whole responses)")  # fmt: skip
    p.add_argument("--tree-budgets", type=lambda t: tuple(int(x) for x in t.split(",")),
                   default=(15, 63), help="DDTree budgets whose held-out tokens a round "
                   "each new best step records (default: 15,63)")  # fmt: skip
    p.add_argument(
        "--every", type=int, default=1000, help="evaluate and log every N steps (default: 1000)"
    )
    p.add_argument("--seed", type=int, default=0, help="default: 0")
    p.add_argument("--save-minutes", type=float, default=2.0,
                   help="checkpoint every N minutes too (default: 2)")  # fmt: skip
    p.add_argument("--checkpoint-moments", choices=["bfloat16", "float32"], default="bfloat16",
                   help="dtype of Adam's moments in checkpoints (default: bfloat16)")  # fmt: skip
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("train_drafter: --device cuda asked for, but torch sees no CUDA GPU",
              file=sys.stderr)  # fmt: skip
        return 2
    from .model import load_tokenizer, load_weights

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    target = load_weights(dtype=dtype).to(device=args.device)
    train(target, load_tokenizer(), args, log=lambda m: print(f"# {m}", flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
