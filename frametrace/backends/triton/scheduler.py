"""Fusion: consecutive realized nodes share a kernel while their iteration spaces match
(the same element count, or rows × row length around a reduction) and each reads the
others only at its own position.  Whether it does is found by generating the kernel:
`NotFusable` ends the group.  Extern calls end groups too: they run between kernels.
A reduction may also join the kernel before the current one, when it does not read the
current one's values (sibling split reductions, see `_join_back`).  And a node that no
extern or kernel since an earlier kernel feeds joins that kernel (`_join_earlier`): a bias
gradient's column sum joins the kernel that stores the gradient, past the matmuls that
read it, and the sum's cast to the parameter's dtype joins the sum.
"""
from __future__ import annotations

from . import config, foreach, tiling
from .kernel_source import Kernel, KernelCodegen, KernelGroup, NotFusable, space_of
from .ir import Computed, Extern


def _same_walk(members, c: Computed, reduction: bool) -> bool:
    """Whether `c` and the members visit memory in one order: a member stored in another
    layout than row-major (its `fill`) shares only a pointwise kernel, with members of its
    shape and layout (reductions walk row-major rows)."""
    walks = {(m.fill, m.shape if m.fill else None) for m in members + [c] if not m.is_reduction}
    if reduction or c.is_reduction:
        return walks <= {(None, None)}
    return len(walks) <= 1


def _fits(group: KernelGroup, c: Computed):
    """The joined kernel's (xnumel, rnumel, reduction) when `c`'s iteration space fits
    `group`'s, else None."""
    x, r, red = group.xnumel, group.rnumel, group.reduction
    cx, cr, cred = space_of(c)
    if red and cred:
        ok = (cx, cr) == (x, r)
    elif red:
        ok = c.numel in (x * r, x)
    elif cred:
        ok = x in (cx * cr, cx)
        x, r, red = cx, cr, True
    else:
        ok = c.numel == x
    return (x, r, red) if ok else None


def _join(group: KernelGroup, c: Computed, avoid=frozenset()):
    space = _fits(group, c)
    if space is None:
        return None
    x, r, red = space
    if not _same_walk(group.members, c, red):
        return None
    columns = getattr(group, "columns", False)
    # a reduction's full-size members row-major, else column-major (a column sum's input)
    for layout in ((columns, not columns) if red else (False,)):
        joined = KernelGroup(group.members + [c], x, r, red, layout)
        try:
            generated = _generate_joined(group, joined, c)
        except NotFusable:
            continue
        if avoid and generated[0].reads & avoid:
            return None
        if config.reuse_generations:
            joined.generated = generated
        return joined
    return None


def _generate_joined(group, joined, c) -> tuple:
    """(code generator, name, source) of `joined` (`group` and then `c`), every member
    stored: continued from `group`'s own generation where the scheduler kept it."""
    if group.generated is not None:
        return group.generated[0].joined(joined, c)
    cg = KernelCodegen(joined, joined.members)
    return (cg, *cg.generate())


def generated(g) -> tuple:
    """(code generator, name, source) of group `g`'s kernel storing every member: the
    one its join made, or made now (and kept, with config.reuse_generations)."""
    if g.generated is not None:
        return g.generated
    cg = KernelCodegen(g, g.members)
    out = (cg, *cg.generate())
    if config.reuse_generations:
        g.generated = out
    return out


def _join_back(out, current, c):
    """`c` joined to the kernel before `current` when it reads nothing `current`
    computes, or None.  Only a reduction into a reduction kernel of its shape: the first
    halves of split reductions of one tensor (partials, then their combination, each)
    share one pass over it."""
    prev = out[-1] if out else None
    if not (c.is_reduction and isinstance(prev, KernelGroup) and prev.reduction
            and space_of(c) == (prev.xnumel, prev.rnumel, True)):
        return None
    return _join(prev, c, avoid={m.name for m in current.members})


# How many kernels back `_join_earlier` looks (each candidate costs a code generation)
EARLIER = 8


def _reads(c: Computed, singles=None, known=None) -> set | None:
    """The names `c`'s code loads (computed values, inputs, extern outputs), or None.
    Found by generating `c`'s kernel alone (or taken from `known[c]`, that group
    generated already), whose group goes to `singles[c]`: the kernel `c` starts when it
    joins none."""
    g = known.get(c) if known is not None else None
    if g is None:
        x, r, red = space_of(c)
        g = KernelGroup([c], x, r, red)
    try:
        cg = generated(g)[0]
    except Exception:
        return None
    if singles is not None:
        singles[c] = g
    return _needs(cg) - {c.name}


def _needs(cg) -> set:
    """What a generated kernel needs before it can launch: the values it loads and the
    shape symbols it takes (a size the data decides is known once the extern that makes
    it has run: `_made` notes its symbol as that extern's)."""
    return cg.reads | set(cg.args) | set(cg.symbols)


def _spots(out, c) -> list:
    """The kernels of `out` (at most EARLIER back, the latest first) that `c` fits."""
    first = max(0, len(out) - EARLIER)
    return [i for i in range(len(out) - 1, first - 1, -1)
            if isinstance(out[i], KernelGroup) and _fits(out[i], c) is not None]


def _join_earlier(out, made, current, c, singles=None, known=None) -> bool:
    """Put `c` into a kernel of `out` (at most EARLIER back) that runs after everything
    `c` reads is computed: the externs since then do not read `c` (they come before it in
    program order), so it may run before them.  Whether it joined.  `singles`, `known`:
    see `_reads`."""
    spots = _spots(out, c)
    if not spots:
        return False
    reads = _reads(c, singles, known)
    if reads is None or (current is not None and reads & {m.name for m in current.members}):
        return False
    ready = max([made[n] for n in reads if n in made] + [made.get(_WRITE, -1)])
    for i in spots:
        if i < ready:
            break
        if out[i].reduction and not c.is_reduction and not reads & {m.name for m in out[i].members}:
            continue  # (a stranger's elements in a reduction's walk: its loads may not coalesce)
        joined = _join(out[i], c)
        if joined is not None:
            out[i] = joined
            made[c.name] = i
            return True
    return False


def _hoist(out, made, current, c, singles=None, known=None) -> bool:
    """`c` reads the current kernel's values and fits an earlier kernel `out[i]` (at
    most EARLIER back) that the current kernel does not depend on: the current kernel
    moves before `out[i]`, and `c` joins `out[i]`, which then runs after everything `c`
    reads.  A masked mean: the mask's sum (a small reduction, after the big sum in
    program order) runs first, and the big sum's kernel divides by it instead of storing
    the sum for a third kernel.  Whether it did."""
    if not config.hoist_kernels or current is None or not isinstance(current, KernelGroup) \
            or any(getattr(m, "in_place", False) for m in current.members):
        return False
    spots = _spots(out, c)
    if not spots:
        return False
    reads = _reads(c, singles, known)
    if reads is None:
        return False
    try:
        cg = generated(current)[0]
    except Exception:
        return False
    names = {m.name for m in current.members}
    cur_reads = _needs(cg) - names
    write = made.get(_WRITE, -1)
    cur_ready = max([made[n] for n in cur_reads if n in made] + [write])
    ready = max([made[n] for n in reads - names if n in made] + [write])
    for i in spots:
        if i < ready or i <= cur_ready:
            break
        if out[i].reduction and not c.is_reduction and not reads & {m.name for m in out[i].members}:
            continue  # (as in _join_earlier)
        joined = _join(out[i], c)
        if joined is None:
            continue
        out[i:i + 1] = [current, joined]
        for n, at in made.items():
            if at >= i:
                made[n] = at + 1
        made.update((n, i) for n in names)
        made[c.name] = i + 1
        return True
    return False


# `made`'s key of the last item that writes memory in place (nothing moves before it)
_WRITE = object()


def _made(made, item, i):
    """Note the names `item` (at `out[i]`) computes, and whether it writes in place."""
    if isinstance(item, Extern) and getattr(getattr(item.op, "_schema", None), "is_mutable", True) \
            or not isinstance(item, Extern) and any(getattr(m, "in_place", False) for m in item.members):
        made[_WRITE] = i
    if isinstance(item, Extern):
        made[item.name] = i
        made.update((s.name, i) for s in item.binds)   # (sizes its result decides)
        stack = [item.outputs]
        while stack:
            o = stack.pop()
            if isinstance(o, (list, tuple)):
                stack += list(o)
            elif hasattr(o, "name"):
                made[o.name] = i
    else:
        made.update((m.name, i) for m in item.members)


def group(items, known=None) -> list:
    """KernelGroups and Externs, in program order.  `known`: {item: the KernelGroup of
    its kernel alone, generated (KernelGroup.generated) in the items' current order},
    where the caller has them (foreach.groups); each is used at most once."""
    out, current, made = [], None, {}
    singles = {}    # the item's kernel alone, when `_join_earlier` generated it

    def close(g):
        _made(made, g, len(out))
        out.append(g)
    for item in items:
        singles.clear()
        if isinstance(item, Extern):
            if current is not None:
                close(current)
                current = None
            close(item)
            continue
        joined = _join(current, item) if current is not None else None
        if joined is None and current is not None:
            back = _join_back(out, current, item)
            if back is not None:
                out[-1] = back
                made[item.name] = len(out) - 1
                continue
        if joined is None and _join_earlier(out, made, current, item, singles, known):
            continue
        if joined is None and _hoist(out, made, current, item, singles, known):
            current = None
            continue
        if joined is None:
            if current is not None:
                close(current)
            # (the group `_reads` generated, the same as a new one: its generation kept)
            current = singles.get(item) if config.reuse_generations else None
            if current is None and known is not None and config.reuse_generations:
                current = known.get(item)
            if current is None:
                x, r, red = space_of(item)
                current = KernelGroup([item], x, r, red)
        else:
            current = joined
    if current is not None:
        close(current)
    return out


def schedule(lowered) -> list:
    """Kernels and Externs in launch order.  A computed value is written to memory only
    when another kernel, an extern or the graph's outputs read it.  A graph that writes its
    inputs (an optimizer step) is reordered into fusible chains (foreach.py).  Independent
    pointwise kernels that follow one another launch together as a combo kernel (the
    casts of parameters, of a backward's gradients): a launch costs host time."""
    ordered = foreach.groups(lowered, group)
    groups = group(lowered.items) if ordered is None else ordered
    needed = set(lowered.wrapper_reads)
    for g in groups:
        if not isinstance(g, Extern):
            cg = generated(g)[0]
            # every pointer it loads: a view of a computed value is loaded as a Buffer
            # of that value's name, not through `reads`
            needed |= cg.reads | (set(cg.args) - set(cg.members))
    out = []
    for g in groups:
        if isinstance(g, Extern):
            out.append(g)
            continue
        stores = [c for c in g.members if c.name in needed]
        if stores:
            cg, name, source = tiling.generate(g, stores)
            out.append(Kernel(g, stores, name, source, dict(cg.args), cg.symbols,
                              getattr(cg, "tile", None)))
    for g in groups:    # (the kernels keep their groups: not the generators' state)
        if not isinstance(g, Extern):
            g.generated = None
    return foreach.combine(out)
