"""The workloads: a model with random weights (nothing is downloaded), AdamW, its data and its loss.

Sizes follow the issue's measurements (H100, torch 2.11, peak allocated):
the encoder ~3.6 GB (bench/step_time.py's workload), ResNet-50 at batch 64
under bf16 autocast ~3.2 GB, ViT-B/16 at batch 16 ~3.4 GB, GPT-2 (124 M
parameters) at batch 8 x 1024 ~13 GB. `--batch NAME=N` changes a batch.
Two Llama-style decoders (transformers' LlamaForCausalLM from a config:
grouped-query attention, RMSNorm, SwiGLU) stress what varies: `llama`
trains on sequence lengths drawn from 256-2048 every step, `llama_generate`
runs generate() (a KV cache growing token by token) on prompt and output
lengths drawn every step; sizes not yet measured. `detection` (torchvision's
Mask R-CNN on images and box counts drawn per step) is the allocation-heavy
one: thousands of small allocations a step, every step of other shapes;
`seq2seq` (a T5-small-sized encoder-decoder on source and target lengths
drawn per step) is the other, shaped like neither detection nor a decoder.

Data is drawn on the device from a seeded generator: every variant and
round sees the same batches, and drawing costs no host time between steps.
torch, torchvision, timm and transformers are imported only by the
workload that needs them, inside the child process.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import step_time  # bench/step_time.py: the encoder workload is defined there once


@dataclass
class Built:
    """A workload ready to train: `batch(warmup)` gives the next inputs, `loss(inputs)` the loss.
    An inference workload has no optimizer (`opt` None): a step is `loss(inputs)` under
    torch.no_grad(), and its "loss" is a checksum of what it produced (equal across allocators)."""

    model: Any
    opt: Any
    batch: Callable[[bool], Any]
    loss: Callable[[Any], Any]


@dataclass(frozen=True)
class Spec:
    name: str
    title: str
    batch: int  # default batch size
    steps: int  # default timed steps (shapes that vary need more to reach their peak)
    startup_s: float  # estimate on an H100: process start, imports, CUDA init, model build
    step_ms: float  # estimate of one step on an H100
    build: Callable[[Any, Any, int, int, int], Built]  # (torch, device, batch, seed, steps)


def _generator(torch: Any, device: Any, seed: int) -> Any:
    return torch.Generator(device=device).manual_seed(seed)


def _adamw(torch: Any, model: Any) -> Any:
    return torch.optim.AdamW(model.parameters(), lr=1e-4)


def _classifier(torch: Any, device: Any, model: Any, batch: int, image: int, classes: int, seed: int,
                autocast: Any = None) -> Built:
    """Image classification with cross-entropy on random images and labels."""
    gen = _generator(torch, device, seed)
    model = model.to(device).train()

    def draw(_warmup: bool) -> tuple[Any, Any]:
        x = torch.randn(batch, 3, image, image, generator=gen, device=device)
        return x, torch.randint(0, classes, (batch,), generator=gen, device=device)

    def loss(inputs: tuple[Any, Any]) -> Any:
        with autocast if autocast is not None else contextlib.nullcontext():
            logits = model(inputs[0])
        return torch.nn.functional.cross_entropy(logits.float(), inputs[1])

    return Built(model, _adamw(torch, model), draw, loss)


def build_convnet(torch: Any, device: Any, batch: int, seed: int, steps: int) -> Built:
    nn = torch.nn

    def block(cin: int, cout: int, stride: int) -> list[Any]:
        return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    model = nn.Sequential(*block(3, 64, 1), *block(64, 128, 2), *block(128, 256, 2), *block(256, 512, 2),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 10))
    return _classifier(torch, device, model, batch, 32, 10, seed)


def build_encoder(torch: Any, device: Any, batch: int, seed: int, steps: int) -> Built:
    """step_time.py's workload: warm-up at its fixed shape, then its seeded random (batch, length)
    sequence; `batch` caps the batch sizes drawn (8, the default, keeps step_time's sequence)."""
    model, opt = step_time.build_model(torch, device)
    model.train()
    gen = _generator(torch, device, seed + 1)
    shapes = iter([(min(b, batch), n) for b, n in step_time.step_shapes(seed, steps)])

    def draw(warmup: bool) -> Any:
        b, n = step_time.WARMUP_SHAPE if warmup else next(shapes)
        return torch.randn(min(b, batch), n, step_time.D_MODEL, generator=gen, device=device)

    return Built(model, opt, draw, lambda x: model(x).float().pow(2).mean())


def build_resnet50(torch: Any, device: Any, batch: int, seed: int, steps: int) -> Built:
    import torchvision

    autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    return _classifier(torch, device, torchvision.models.resnet50(weights=None), batch, 224, 1000, seed, autocast)


def build_vit_b16(torch: Any, device: Any, batch: int, seed: int, steps: int) -> Built:
    import timm

    return _classifier(torch, device, timm.create_model("vit_base_patch16_224", pretrained=False), batch, 224,
                       1000, seed)


GPT2_LENGTH = 1024


def build_gpt2(torch: Any, device: Any, batch: int, seed: int, steps: int) -> Built:
    import transformers

    transformers.logging.set_verbosity_error()  # random weights and no loss_type are intended: no warnings
    config = transformers.GPT2Config(n_layer=12)  # GPT-2 small: d 768, 12 heads, vocab 50257, 1024 positions
    model = transformers.GPT2LMHeadModel(config).to(device).train()
    gen = _generator(torch, device, seed)

    def draw(_warmup: bool) -> Any:
        return torch.randint(0, config.vocab_size, (batch, GPT2_LENGTH), generator=gen, device=device)

    return Built(model, _adamw(torch, model), draw, lambda ids: model(input_ids=ids, labels=ids).loss)


# Llama-style decoder (LlamaForCausalLM from a config, random weights): 8 layers, d 1024, 16 query heads
# sharing 4 key/value heads (grouped-query attention), SwiGLU MLP of 2816, RMSNorm, vocab 32000: ~150 M
# parameters, ~10 GB peak at batch 8 x 2048 in fp32 with AdamW (a guess until measured).
LLAMA = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5)
LLAMA_LENGTHS = (256, 2048)  # training: a length drawn per step from this range, in steps of 128
GENERATE_PROMPT, GENERATE_NEW = (64, 1024), (32, 256)  # generate(): prompt and output lengths drawn per step


def _llama(torch: Any, device: Any, layers: int | None = None) -> Any:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(**{**LLAMA, **({"num_hidden_layers": layers} if layers else {})})
    return transformers.LlamaForCausalLM(config).to(device)


def _decoder_training(torch: Any, device: Any, model: Any, vocab: int, batch: int, seed: int, steps: int) -> Built:
    """Training a decoder on lengths drawn per step, warm-up steps too (seeded: every variant sees the same
    sequence), as a user's data loader would give them: the largest shape comes when it comes."""
    gen = _generator(torch, device, seed)
    lengths = torch.randint(LLAMA_LENGTHS[0] // 128, LLAMA_LENGTHS[1] // 128 + 1, (steps + 64,),
                            generator=torch.Generator().manual_seed(seed)).tolist()
    drawn = iter(lengths)

    def draw(_warmup: bool) -> Any:
        return torch.randint(0, vocab, (batch, 128 * next(drawn)), generator=gen, device=device)

    return Built(model, _adamw(torch, model), draw, lambda ids: model(input_ids=ids, labels=ids).loss)


def build_llama(torch: Any, device: Any, batch: int, seed: int, steps: int) -> Built:
    return _decoder_training(torch, device, _llama(torch, device).train(), LLAMA["vocab_size"], batch, seed, steps)


MOE = dict(hidden_size=1024, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=16,
           num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2, vocab_size=32000,
           max_position_embeddings=4096, rms_norm_eps=1e-5)


def build_moe(torch: Any, device: Any, batch: int, seed: int, steps: int) -> Built:
    """A mixture-of-experts decoder (transformers' MixtralForCausalLM from a config, random weights): each
    expert sees as many tokens as the router sends it, so the shapes vary within a step as well as between
    steps."""
    import transformers

    transformers.logging.set_verbosity_error()
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**MOE)).to(device).train()
    return _decoder_training(torch, device, model, MOE["vocab_size"], batch, seed, steps)


def build_llama_generate(torch: Any, device: Any, batch: int, seed: int, steps: int) -> Built:
    """Inference: greedy generate() of a drawn number of new tokens after a drawn prompt length; the KV
    cache grows by a token at a time (DynamicCache: a new, larger tensor per layer and token)."""
    model = _llama(torch, device, layers=4).eval()
    gen = _generator(torch, device, seed)
    host = torch.Generator().manual_seed(seed)
    shapes = iter([(int(torch.randint(GENERATE_PROMPT[0], GENERATE_PROMPT[1] + 1, (), generator=host)),
                    int(torch.randint(GENERATE_NEW[0], GENERATE_NEW[1] + 1, (), generator=host)))
                   for _ in range(steps + 64)])

    def draw(_warmup: bool) -> Any:  # warm-up steps draw too, as for llama
        prompt, new = next(shapes)
        return torch.randint(1, LLAMA["vocab_size"], (batch, prompt), generator=gen, device=device), new

    def run(inputs: Any) -> Any:
        ids, new = inputs
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=0)
        return out[:, ids.shape[1]:].sum().double()  # a checksum of the tokens: the same under every allocator

    return Built(model, None, draw, run)


DETECTION_SIDES = (480, 800)  # each image's height and width drawn from this range, in steps of 32
DETECTION_BOXES = (1, 24)  # boxes per image, drawn


def build_detection(torch: Any, device: Any, batch: int, seed: int, steps: int) -> Built:
    """Allocation-heavy training: torchvision's Mask R-CNN (ResNet-50 FPN, random weights) on `batch` images
    per step, each of a drawn size with a drawn number of boxes (and their masks): the model resizes each
    image, so every step's tensors have other shapes, and the proposals, matching and mask heads make
    thousands of small allocations a step."""
    import torchvision

    model = torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None,
                                                               num_classes=91).to(device).train()
    gen = _generator(torch, device, seed)
    host = torch.Generator().manual_seed(seed)

    def draw_int(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (), generator=host))

    def target(h: int, w: int) -> dict[str, Any]:
        n = draw_int(*DETECTION_BOXES)
        corner = torch.rand(n, 2, generator=gen, device=device) * torch.tensor([w * 0.7, h * 0.7], device=device)
        extent = 16 + torch.rand(n, 2, generator=gen, device=device) * torch.tensor([w * 0.3, h * 0.3], device=device)
        boxes = torch.cat([corner, corner + extent], dim=1)
        ys = torch.arange(h, device=device).view(1, h, 1)
        xs = torch.arange(w, device=device).view(1, 1, w)
        masks = ((ys >= boxes[:, 1, None, None]) & (ys < boxes[:, 3, None, None]) &
                 (xs >= boxes[:, 0, None, None]) & (xs < boxes[:, 2, None, None])).to(torch.uint8)
        labels = torch.randint(1, 91, (n,), generator=gen, device=device)
        return {"boxes": boxes, "labels": labels, "masks": masks}

    def draw(_warmup: bool) -> Any:
        images, targets = [], []
        for _ in range(batch):
            h, w = 32 * draw_int(DETECTION_SIDES[0] // 32, DETECTION_SIDES[1] // 32), \
                32 * draw_int(DETECTION_SIDES[0] // 32, DETECTION_SIDES[1] // 32)
            images.append(torch.rand(3, h, w, generator=gen, device=device))
            targets.append(target(h, w))
        return images, targets

    def loss(inputs: Any) -> Any:
        return sum(model(*inputs).values())

    return Built(model, _adamw(torch, model), draw, loss)


SEQ2SEQ = dict(vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=6, num_heads=8,
               decoder_start_token_id=0, pad_token_id=0)
SEQ2SEQ_SOURCE = (32, 512)  # source tokens, drawn per step (a multiple of 8)
SEQ2SEQ_TARGET = (8, 192)  # target tokens, drawn per step


def build_seq2seq(torch: Any, device: Any, batch: int, seed: int, steps: int) -> Built:
    """Allocation-heavy, not shaped like detection: an encoder-decoder (transformers' T5ForConditionalGeneration
    from a t5-small-sized config, random weights) on source and target lengths drawn independently every step,
    as a translation or summarisation batch of a length-bucketing loader: every step's activations, attention
    scores and cross-attention have other shapes, in many small tensors of relative-position biases and
    layer norms."""
    import transformers

    transformers.logging.set_verbosity_error()
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**SEQ2SEQ)).to(device).train()
    gen = _generator(torch, device, seed)
    host = torch.Generator().manual_seed(seed)
    shapes = iter([(8 * int(torch.randint(SEQ2SEQ_SOURCE[0] // 8, SEQ2SEQ_SOURCE[1] // 8 + 1, (), generator=host)),
                    int(torch.randint(SEQ2SEQ_TARGET[0], SEQ2SEQ_TARGET[1] + 1, (), generator=host)))
                   for _ in range(steps + 64)])

    def draw(_warmup: bool) -> Any:
        source, target = next(shapes)
        vocab = SEQ2SEQ["vocab_size"]
        return (torch.randint(1, vocab, (batch, source), generator=gen, device=device),
                torch.randint(1, vocab, (batch, target), generator=gen, device=device))

    def loss(inputs: Any) -> Any:
        ids, labels = inputs
        return model(input_ids=ids, labels=labels).loss

    return Built(model, _adamw(torch, model), draw, loss)


WORKLOADS: dict[str, Spec] = {s.name: s for s in (
    Spec("convnet", "small conv net (4 conv+BN+ReLU, 32x32 images, 10 classes), AdamW", 128, 40, 4, 4,
         build_convnet),
    Spec("encoder", f"{step_time.LAYERS}-layer d{step_time.D_MODEL} nn.TransformerEncoder, variable batch x length "
         f"(warm-up {step_time.WARMUP_SHAPE[0]} x {step_time.WARMUP_SHAPE[1]}), AdamW", 8, 40, 4.5, 30,
         build_encoder),
    Spec("resnet50", "torchvision resnet50(weights=None), bf16 autocast, 224x224, AdamW", 64, 15, 5, 70,
         build_resnet50),
    Spec("vit_b16", "timm vit_base_patch16_224(pretrained=False), fp32, AdamW", 16, 15, 6, 50, build_vit_b16),
    Spec("gpt2", f"transformers GPT2LMHeadModel(GPT2Config(n_layer=12)), random weights, length {GPT2_LENGTH}, "
         "fp32, AdamW", 8, 10, 8, 170, build_gpt2),
    Spec("llama", f"Llama-style LlamaForCausalLM (8 layers, d 1024, GQA 16/4 heads, SwiGLU, RMSNorm), random weights, "
         f"length drawn per step from {LLAMA_LENGTHS[0]}-{LLAMA_LENGTHS[1]}, fp32, AdamW", 8, 40, 10, 150,
         build_llama),
    Spec("moe", f"Mixtral-style mixture-of-experts decoder (MixtralForCausalLM: 4 layers, d 1024, 8 experts, top 2, "
         f"GQA 16/4 heads), random weights, length drawn per step from {LLAMA_LENGTHS[0]}-{LLAMA_LENGTHS[1]}, fp32, "
         "AdamW", 8, 40, 12, 250, build_moe),
    Spec("detection", f"torchvision maskrcnn_resnet50_fpn(weights=None), images {DETECTION_SIDES[0]}-"
         f"{DETECTION_SIDES[1]} px a side and {DETECTION_BOXES[0]}-{DETECTION_BOXES[1]} boxes drawn per image, fp32, "
         "AdamW: thousands of allocations a step", 4, 30, 8, 150, build_detection),
    Spec("seq2seq", f"T5-small-sized encoder-decoder (T5ForConditionalGeneration: 6+6 layers, d 512), random weights, "
         f"source {SEQ2SEQ_SOURCE[0]}-{SEQ2SEQ_SOURCE[1]} and target {SEQ2SEQ_TARGET[0]}-{SEQ2SEQ_TARGET[1]} tokens "
         "drawn per step, fp32, AdamW", 32, 30, 10, 60, build_seq2seq),
    Spec("llama_generate", f"generate() on the Llama config (4 layers), greedy, prompt {GENERATE_PROMPT[0]}-"
         f"{GENERATE_PROMPT[1]} and {GENERATE_NEW[0]}-{GENERATE_NEW[1]} new tokens drawn per step, KV cache growing",
         8, 15, 10, 700, build_llama_generate),
)}


def parse_workloads(text: str) -> list[Spec]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        raise ValueError(f"unknown workload(s) {', '.join(unknown) or '(none given)'}: "
                         f"known are {', '.join(WORKLOADS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a workload is listed twice in {text!r}")
    return [WORKLOADS[n] for n in names]


def parse_batches(items: list[str]) -> dict[str, int]:
    """--batch NAME=N, repeatable."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in WORKLOADS or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--batch {item!r}: expected NAME=N with N >= 1 and NAME one of {', '.join(WORKLOADS)}")
        out[name] = int(value)
    return out
