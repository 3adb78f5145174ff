"""torchalloc.track(model, optimizer): tag a training step's phases automatically.

Semantics (all phases are process-wide, see phases.py):

- "forward": from the top-level `model`'s forward pre-hook to its forward
  hook (registered with always_call, so an exception still ends it). Only
  the top-level module is hooked: submodules run inside its forward.
- "backward": the whole of every autograd pass, i.e. every call of
  torch.autograd.backward (which Tensor.backward, hence loss.backward() and
  GradScaler's scaled loss, goes through) and torch.autograd.grad. It
  begins before the engine runs the first node and ends when the call
  returns, so the loss head's gradients (e.g. the logits' gradient, often
  the largest backward allocation) and everything the engine's device
  threads allocate are included. Loss computation between forward and
  backward stays in the enclosing phase.
- "optimizer": optimizer.step(), through register_step_pre_hook and
  register_step_post_hook (an LR scheduler's own step wrapper is untouched).
- "zero_grad": optimizer.zero_grad() and model.zero_grad().

A name prefix (`prefix="gen."` gives "gen.forward" ...) tells several
tracked models apart; autograd passes are process-wide, so while several
handles are active they are all tagged with the first handle's backward
name. If optimizer.step() raises, its phase stays open (torch runs no post
hook then). The returned handle's remove() undoes everything.

Why autograd's entry points are wrapped rather than hooked on tensors: a
hook on the forward output fires only once the engine reaches the model's
output, after the loss head's gradients were allocated, and it ends on an
engine thread. Wrapping the two Python entry points begins and ends the
phase on the calling thread, in LIFO order with the user's own phases.
The wrapper is installed once for all handles and removed with the last one.

Modules (modules=True, the default): every block the log records gets the
innermost nn.Module whose forward or backward was running when it was
allocated, and parameters, their gradients and optimizer state the module
that owns the parameter (analysis/sections/modules.py reads it;
docs/LOG_FORMAT.md, "Modules"). Like the phase, the current module is process-wide: the
autograd engine runs backward on its own threads. It costs nothing per
allocation (the C side writes one MODULE record when it changes, never
looks at it when allocating) and, per forward call of a module, two hook
calls and two ctypes calls.

- Forward: each module's forward pre-hook makes it current; its forward
  hook makes the module it was called from current again (a process-wide
  stack, innermost last).
- Backward: the forward hook marks the autograd node that made each of the
  module's outputs (the innermost module claims a node first); a pre-hook on
  that node makes the module current when the engine reaches it. Node hooks
  leave the graph as it is (full backward hooks would wrap the module's
  inputs, and a module that changes its input in place, ReLU(inplace=True),
  then fails). The price: a module's backward lasts until the next marked
  node begins, so the backward of a parent's own operations after its last
  child (a residual add) counts for that child. When torch.autograd.backward
  or grad returns, the forward stack's top (or no module) is current again.
- Parameters: tagged by address at track() time (a model moved to another
  device afterwards is not re-tagged: call track() after .to(device)).
  Gradients: tagged by a post-accumulate-grad hook on each parameter (torch
  2.1 or newer). Optimizer state: tagged after each optimizer step, only the
  tensors whose address changed (the first step, mostly).
- Paths: "model.layers.3.mlp" (the root is `prefix` without its dot, or
  "model"), named in the log at track() time: open the log (install(log=...))
  before calling track(), a log opened later knows the modules by number only.
"""
from __future__ import annotations

import functools
import itertools
import threading
import types
from typing import Any, Callable

from . import _lib
from .phases import phase

_autograd_lock = threading.Lock()
_autograd_users: dict[str, int] = {}  # backward phase name -> handles using it
_autograd_originals: dict[str, Callable[..., Any]] = {}


# Modules: process-wide, like phases (see the docstring).
_module_ids = itertools.count(1)  # ids of every tracked model's modules, never reused in a process
_module_stack: list[int] = []  # the forward calls running, innermost last
_module_users = [0]  # handles tracking modules: the autograd wrapper restores the module only for them
_NODE_KEY = "torchalloc_module"  # in an autograd node's metadata: the module that claimed it


def _set_module(module_id: int) -> None:
    _lib.lib().torchalloc_module_set(module_id)


def _wrap_autograd_entry(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        names = list(_autograd_users)
        if not names:
            return original(*args, **kwargs)
        try:
            with phase(names[0]):
                return original(*args, **kwargs)
        finally:
            if _module_users[0]:  # backward's last module is no longer running
                _set_module(_module_stack[-1] if _module_stack else 0)

    wrapper.__torchalloc_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _autograd_acquire(name: str) -> None:
    import torch.autograd

    with _autograd_lock:
        if not _autograd_originals:
            for entry in ("backward", "grad"):
                original = getattr(torch.autograd, entry)
                _autograd_originals[entry] = original
                setattr(torch.autograd, entry, _wrap_autograd_entry(original))
        _autograd_users[name] = _autograd_users.get(name, 0) + 1


def _autograd_release(name: str) -> None:
    import torch.autograd

    with _autograd_lock:
        _autograd_users[name] -= 1
        if _autograd_users[name] == 0:
            del _autograd_users[name]
        if not _autograd_users:
            for entry, original in _autograd_originals.items():
                setattr(torch.autograd, entry, original)
            _autograd_originals.clear()


class TrackHandle:
    """What track() installed; remove() takes all of it out again."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.names = {k: prefix + k for k in ("forward", "backward", "optimizer", "zero_grad")}
        self._undo: list[Callable[[], None]] = []

    def _on_undo(self, fn: Callable[[], None]) -> None:
        self._undo.append(fn)

    def remove(self) -> None:
        """Remove every hook and wrapper (idempotent)."""
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> "TrackHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _hook_forward(handle: TrackHandle, model: Any, eval_phase: str | None) -> None:
    forward = phase(handle.names["forward"])
    evaluation = forward if eval_phase is None else phase(handle.prefix + eval_phase)
    entered: list[phase] = []  # the phase each running forward entered (forwards may nest: recursion)

    def pre_hook(module: Any, args: Any) -> None:
        chosen = forward if module.training else evaluation
        chosen.__enter__()
        entered.append(chosen)

    def post_hook(module: Any, args: Any, output: Any) -> None:
        if entered:
            entered.pop().__exit__(None, None, None)

    pre = model.register_forward_pre_hook(pre_hook)
    try:
        post = model.register_forward_hook(post_hook, always_call=True)
    except TypeError:  # torch before always_call: an exception in forward leaves it open
        post = model.register_forward_hook(post_hook)
    handle._on_undo(pre.remove)
    handle._on_undo(post.remove)


def _hook_optimizer(handle: TrackHandle, optimizer: Any) -> None:
    step = phase(handle.names["optimizer"])

    # Both hooks must return None: a pre-hook's return value replaces step()'s arguments.
    def pre_hook(opt: Any, args: Any, kwargs: Any) -> None:
        step.__enter__()

    def post_hook(opt: Any, args: Any, kwargs: Any) -> None:
        step.__exit__(None, None, None)

    pre = optimizer.register_step_pre_hook(pre_hook)
    post = optimizer.register_step_post_hook(post_hook)
    handle._on_undo(pre.remove)
    handle._on_undo(post.remove)


def _wrap_zero_grad(handle: TrackHandle, obj: Any) -> None:
    """Wrap obj.zero_grad on the instance, as a bound method (so nothing that
    inspects it, like LR schedulers do with step, sees a plain function)."""
    zero = phase(handle.names["zero_grad"])
    had_own = "zero_grad" in vars(obj)
    original = obj.zero_grad

    def zero_grad(self: Any, *args: Any, **kwargs: Any) -> Any:
        with zero:
            return original(*args, **kwargs)

    obj.zero_grad = types.MethodType(functools.wraps(original)(zero_grad), obj)

    def undo() -> None:
        if had_own:
            obj.zero_grad = original
        else:
            vars(obj).pop("zero_grad", None)

    handle._on_undo(undo)


def _tensors(output: Any) -> list[Any]:
    """The tensors of a module's output: itself, or those in a tuple, list or dict, one level down too."""
    found: list[Any] = []
    stack = [(output, 0)]
    while stack:
        x, depth = stack.pop()
        if hasattr(x, "grad_fn"):
            found.append(x)
        elif depth < 2 and isinstance(x, (tuple, list)):
            stack.extend((y, depth + 1) for y in x)
        elif depth < 2 and isinstance(x, dict):
            stack.extend((y, depth + 1) for y in x.values())
    return found


def _claim_nodes(output: Any, module_id: int) -> None:
    """Make module_id current when the engine reaches the nodes that made `output` (unless an inner module
    claimed them first: its forward hook ran earlier)."""
    for tensor in _tensors(output):
        node = tensor.grad_fn
        metadata = getattr(node, "metadata", None)  # None: no graph, or a torch without node metadata
        if metadata is None:
            continue
        if _NODE_KEY in metadata:
            continue
        metadata[_NODE_KEY] = module_id

        def prehook(grad_outputs: Any, module_id: int = module_id) -> None:
            _set_module(module_id)

        node.register_prehook(prehook)


def _hook_modules(handle: TrackHandle, model: Any, optimizer: Any | None) -> None:
    """Name every module of `model` in the log, make the running one current, tag parameters,
    gradients and optimizer state with their owner (see the module docstring)."""
    if not _lib.has("torchalloc_module_set"):
        return  # a library built before module records: phases only
    import torch

    lib = _lib.lib()
    root = handle.prefix.rstrip(".") or "model"
    owner: dict[Any, int] = {}  # parameter -> its module's id (a shared parameter: its first module)
    for name, module in model.named_modules():
        module_id = next(_module_ids)
        lib.torchalloc_module_name(module_id, f"{root}.{name}".rstrip(".").encode("utf-8", "replace"))
        for p in module.parameters(recurse=False):
            owner.setdefault(p, module_id)
        _hook_module(handle, module, module_id, torch.is_grad_enabled)
    for p, module_id in owner.items():
        if p.device.type == "cuda":
            lib.torchalloc_module_tag(p.data_ptr(), module_id, 1)
        if p.requires_grad and hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1

            def grad_hook(param: Any, module_id: int = module_id) -> None:
                if param.grad is not None and param.grad.device.type == "cuda":
                    lib.torchalloc_module_tag(param.grad.data_ptr(), module_id, 2)

            handle._on_undo(p.register_post_accumulate_grad_hook(grad_hook).remove)
    if optimizer is not None:
        _hook_optimizer_state(handle, optimizer, owner, lib, torch)
    _module_users[0] += 1

    def undo() -> None:
        _module_users[0] -= 1
        _set_module(0)

    handle._on_undo(undo)


def _hook_module(handle: TrackHandle, module: Any, module_id: int, grad_enabled: Callable[[], bool]) -> None:
    def pre_hook(module: Any, args: Any) -> None:
        _module_stack.append(module_id)
        _set_module(module_id)

    def post_hook(module: Any, args: Any, output: Any) -> None:
        if _module_stack:
            _module_stack.pop()
        _set_module(_module_stack[-1] if _module_stack else 0)
        if output is not None and grad_enabled():
            _claim_nodes(output, module_id)

    pre = module.register_forward_pre_hook(pre_hook)
    try:
        post = module.register_forward_hook(post_hook, always_call=True)
    except TypeError:  # torch before always_call
        post = module.register_forward_hook(post_hook)
    handle._on_undo(pre.remove)
    handle._on_undo(post.remove)


def _hook_optimizer_state(handle: TrackHandle, optimizer: Any, owner: dict[Any, int], lib: Any, torch: Any) -> None:
    tagged: dict[tuple[int, str], int] = {}  # (id of the parameter, state key) -> the address last tagged

    def post_hook(opt: Any, args: Any, kwargs: Any) -> None:
        for p, state in opt.state.items():
            module_id = owner.get(p)
            if module_id is None or not isinstance(state, dict):
                continue
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                    ptr = value.data_ptr()
                    if tagged.get((id(p), key)) != ptr:
                        tagged[(id(p), key)] = ptr
                        lib.torchalloc_module_tag(ptr, module_id, 3)

    handle._on_undo(optimizer.register_step_post_hook(post_hook).remove)


def track(
    model: Any,
    optimizer: Any | None = None,
    *,
    prefix: str = "",
    zero_grad: bool = True,
    eval_phase: str | None = None,
    modules: bool = True,
) -> TrackHandle:
    """Tag forward, backward, optimizer step and zero_grad of `model` as phases.

    See this module's docstring for exactly what each phase covers.
    zero_grad=False leaves model.zero_grad alone (a trainer that marks that
    part of the step itself). eval_phase names the phase of a forward run
    while the model is in eval mode (model.training False; default: "forward"
    as in training), so evaluation inside a training run is told apart.
    modules=False leaves the model's submodules unhooked: no memory by module
    (the module docstring says what modules=True hooks and what it costs).
    Returns a handle; call .remove() (or use it as a context manager) to stop.
    """
    handle = TrackHandle(prefix)
    try:
        _hook_forward(handle, model, eval_phase)
        _autograd_acquire(handle.names["backward"])
        handle._on_undo(lambda: _autograd_release(handle.names["backward"]))
        if zero_grad:
            _wrap_zero_grad(handle, model)
        if optimizer is not None:
            _hook_optimizer(handle, optimizer)
            _wrap_zero_grad(handle, optimizer)
        if modules:
            _hook_modules(handle, model, optimizer)
    except BaseException:
        handle.remove()
        raise
    return handle
