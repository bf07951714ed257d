"""Pipeline parallelism as sharding (GSPMD section 3.3).

All stages run the same computation with different weights, so the stages
are vectorised: every weight a stage creates gets a leading `stage` dim,
and one program computes all stages at once on a state buffer
[stage, microbatch...]. Each iteration every stage runs its layers on its
slot of the buffer, then the buffer shifts by one stage (mtf.shift along
`stage`: a collective permute when the layout splits `stage` over a mesh
axis, local otherwise). Stage 0 takes the next microbatch instead of the
shifted value; the last stage's result is a finished microbatch. With M
microbatches and S stages that is M + S - 1 iterations: the S - 1 extra
ones are the bubble, where stages compute on padding.

Circular schedule (GSPMD's "circular", Megatron's "interleaved"): each
stage holds R = circular_repeats chunks of layers (chunk r*S + s on stage
s), the buffer wraps from the last stage back to the first, and a
microbatch goes round the stages R times. Microbatch m = b*S + j reaches
chunk r*S + s at iteration b*S*R + r*S + j + s: each (stage, iteration)
has at most one (microbatch, chunk), M*R + S - 1 iterations in all when S
divides M, and the bubble is (S - 1) / (M*R + S - 1) instead of
(S - 1) / (M + S - 1).

Nothing here is specific to a mesh: the same graph runs on one device (the
stage dim unsplit) and on any layout -- layout invariance is what the tests
check. Microbatch m holds the batch rows m, M + m, 2M + m, ... (a strided
split), so a batch split over a data axis stays where it is.

Weights: `pipeline` installs a custom getter (mtf.custom_getter) while the
stage function runs: a get_variable(name, shape) in it returns the
variable name:[stage(, stage_repeat), shape...] with this iteration's
chunk of each stage selected. The stacked variable's initial value at
[s, r] is what get_variable(original_name(name, r*S + s), shape) would
have started with (StackedInitializer), so a pipelined model starts from
exactly the unpipelined model's weights.

Example:
  >>> import meshtf as mtf
  >>> graph = mtf.Graph(); mesh = mtf.Mesh(graph, "m")
  >>> x = mtf.ones(mesh, "batch:8;io:4")
  >>> def stage_fn(h, carried):    # h: [stage:2, batch:2, io:4]
  ...   w = mtf.get_variable(mesh, "w", "io:4")   # w: [stage:2, io:4]
  ...   return mtf.tanh(h * w)
  >>> y = pipeline(stage_fn, x, stages=2, num_microbatches=4)
  >>> y.shape
  Shape([batch:8, io:4])
"""
import copy

import numpy as np
import tensorflow as tf

import meshtf as mtf
from meshtf import shapes
from meshtf.lowering import rng
from meshtf.ops import control
from meshtf.ops import initializers
from meshtf.ops import variables

STAGE_DIM_NAME = "stage"
REPEAT_DIM_NAME = "stage_repeat"    # chunks one stage holds (circular)
MICROBATCH_DIM_NAME = "microbatches"
ITERATION = "pipeline_iteration"  # carried[ITERATION]: the loop's iteration


# --- the schedule (pure Python) -----------------------------------------------
class Schedule(object):
  """Which microbatch and chunk each stage runs at each iteration.

  Example:
    >>> s = Schedule(stages=2, num_microbatches=4)
    >>> s.num_iterations, s.slot(0, 1), s.slot(1, 1)
    (5, None, (0, 0))
    >>> round(s.bubble_fraction, 3)
    0.2
  """

  def __init__(self, stages, num_microbatches, circular_repeats=1):
    for what, n in (("stages", stages), ("num_microbatches",
                                         num_microbatches),
                    ("circular_repeats", circular_repeats)):
      if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise ValueError("pipeline: %s=%r must be a positive integer" % (
            what, n))
    self.stages = int(stages)
    self.num_microbatches = int(num_microbatches)
    self.circular_repeats = int(circular_repeats)
    s, m, r = self.stages, self.num_microbatches, self.circular_repeats
    # Microbatch M-1 leaving the last chunk is the last event.
    last = self._iteration(m - 1, r - 1, s - 1)
    self.num_iterations = last + 1

  def _iteration(self, microbatch, repeat, stage):
    s, r = self.stages, self.circular_repeats
    block, j = divmod(microbatch, s)
    return block * s * r + repeat * s + j + stage

  def slot(self, iteration, stage):
    """(microbatch, repeat) stage `stage` works on at `iteration`, or None
    in the bubble. Its chunk of layers is repeat * stages + stage."""
    s, r = self.stages, self.circular_repeats
    k = iteration - stage
    if k < 0:
      return None
    j, k = k % s, k // s
    repeat, block = k % r, k // r
    microbatch = block * s + j
    if microbatch >= self.num_microbatches:
      return None
    return microbatch, repeat

  def table(self):
    """[iteration][stage] -> "m<microbatch>" (with ".r<repeat>" when
    circular) or "-" in the bubble: the schedule drawn.

    Example:
      >>> Schedule(2, 2).table()
      [['m0', '-'], ['m1', 'm0'], ['-', 'm1']]
    """
    out = []
    for t in range(self.num_iterations):
      row = []
      for st in range(self.stages):
        slot = self.slot(t, st)
        if slot is None:
          row.append("-")
        elif self.circular_repeats > 1:
          row.append("m%d.r%d" % slot)
        else:
          row.append("m%d" % slot[0])
      out.append(row)
    return out

  @property
  def bubble_fraction(self):
    """Idle (stage, iteration) slots over all of them: (S - 1) / (M*R +
    S - 1) when S divides M or R = 1."""
    busy = self.num_microbatches * self.circular_repeats * self.stages
    return 1.0 - busy / float(self.num_iterations * self.stages)


def bubble_fraction(stages, num_microbatches, circular_repeats=1):
  """The analytic bubble fraction of a pipeline schedule.

  Example:
    >>> bubble_fraction(4, 8), bubble_fraction(4, 8, circular_repeats=2)
    (0.2727272727272727, 0.15789473684210525)
  """
  return Schedule(stages, num_microbatches, circular_repeats).bubble_fraction


# --- stacked variables --------------------------------------------------------
class StackedInitializer(initializers.Initializer):
  """The initial value of a variable [stage, (stage_repeat,) shape...]
  whose [s, r] part starts as the variable names[s][r] of `shape` would
  (same initializer, same graph seed): a pipelined model starts from the
  unpipelined one's weights, fans of variance scaling included.

  Example:
    >>> init = StackedInitializer(mtf.random_normal_initializer(), 0,
    ...                           [["l0/w"], ["l1/w"]], lead_dims=1)
  """

  def __init__(self, base, seed, names, lead_dims):
    self.base = initializers.convert_initializer(base)
    self.seed = seed
    self.names = [list(row) for row in names]
    self.lead_dims = lead_dims

  def cache_key(self):
    return None   # the names are no plain scalars

  def slice_value(self, key, begin, slice_shape, full_shape, dtype):
    lead = self.lead_dims
    begin = tf.cast(begin, tf.int64)
    # Each part through the base initializer's cached traced function (the
    # one the unpipelined variables use): tracing S*R Threefry graphs per
    # stacked variable would cost ~0.5 s each.
    rest = [initializers.traced_slice_fn(
        self.base, rng.op_key(self.seed, name), list(full_shape[lead:]),
        dtype)(begin[lead:], list(slice_shape[lead:]))
            for row in self.names for name in row]
    stacked = tf.reshape(tf.stack(rest), list(full_shape[:lead]) +
                         list(slice_shape[lead:]))
    # Slices of an uneven split of a stacked dim reach past its end.
    lead_begin = tf.cast(begin[:lead], tf.int32)
    past = tf.maximum(lead_begin + list(slice_shape[:lead]) -
                      list(full_shape[:lead]), 0)
    pads = tf.concat([tf.stack([tf.zeros_like(past), past], axis=1),
                      tf.zeros([len(full_shape) - lead, 2], tf.int32)], 0)
    stacked = tf.pad(stacked, pads)
    return tf.slice(stacked, tf.concat(
        [lead_begin, tf.zeros([len(full_shape) - lead], tf.int32)], 0),
                    list(slice_shape))


def _default_original_name(name, chunk):
  return "%s/chunk_%03d" % (name, chunk)


class _StackedGetter(object):
  """A custom getter that gives every variable the stage (and
  stage_repeat) dims and hands back select(w), the part this call uses.

  stacked_name(name) -> (the stacked variable's name, select) or None
  for a variable to leave alone; original_name(stacked_name, chunk) -> the
  name whose initial value the stacked variable takes at chunk r*S + s.
  """

  def __init__(self, stage_dim, repeat_dim, stacked_name, original_name):
    self.stage_dim, self.repeat_dim = stage_dim, repeat_dim
    self.stacked_name = stacked_name
    self.original_name = original_name

  def __call__(self, base, mesh, name, shape, dtype=tf.float32,
               initializer=None, trainable=True, activation_dtype=None,
               layout=None, **unused):
    target = self.stacked_name(name)
    if target is None:
      return base(mesh, name, shape, dtype=dtype, initializer=initializer,
                  trainable=trainable, activation_dtype=activation_dtype,
                  layout=layout)
    name, select = target
    shape = shapes.convert_to_shape(shape)
    if layout is not None:
      raise ValueError(
          "pipeline: variable %r asks for its own layout %r; inside a "
          "pipeline stage variables take the rules' layout (lay out %r and "
          "the other dims with the layout rules)" % (name, layout,
                                                     STAGE_DIM_NAME))
    for d in shape.dims:
      if d.name in (STAGE_DIM_NAME, REPEAT_DIM_NAME):
        raise ValueError("pipeline: variable %r %s already has a %r dim"
                         % (name, shape, d.name))
    lead = [self.stage_dim] + ([self.repeat_dim] if self.repeat_dim else [])
    repeats = self.repeat_dim.size if self.repeat_dim else 1
    stages = self.stage_dim.size
    names = [[self.original_name(name, r * stages + s)
              for r in range(repeats)] for s in range(stages)]
    init = StackedInitializer(initializer, mesh.graph.seed, names,
                              len(lead))
    w = select(base(mesh, name, mtf.Shape(lead + shape.dims), dtype=dtype,
                    initializer=init, trainable=trainable), shape)
    if activation_dtype is not None and tf.as_dtype(activation_dtype) != (
        w.dtype):
      w = mtf.cast(w, activation_dtype)
    return w


def _select_by(onehot, keep=()):
  """select(w, shape): w [stage(, stage_repeat), shape...] contracted with
  `onehot` over its lead dims, keeping the dims in `keep` (None: w
  unchanged). A local einsum; a sum over a split stage is an allreduce."""
  def select(w, shape):
    if onehot is None:
      return w
    sel = mtf.cast(onehot, w.dtype) if onehot.dtype != w.dtype else onehot
    return mtf.einsum([w, sel], output_shape=mtf.Shape(list(keep) +
                                                       shape.dims))
  return select


# --- the vectorised loop ------------------------------------------------------
def check_batch(batch_dim, num_microbatches, what="pipeline"):
  """Raises ValueError (one line: sizes and fix) unless the batch splits
  into num_microbatches equal microbatches.

  Example:
    >>> check_batch(mtf.Dimension("batch", 8), 3)
    Traceback (most recent call last):
    ValueError: pipeline: batch size 8 is not divisible by ...
  """
  if batch_dim.size % num_microbatches:
    raise ValueError(
        "%s: %s size %d is not divisible by num_microbatches=%d: use a "
        "batch size that is a multiple of %d or a num_microbatches that "
        "divides %d" % (what, batch_dim.name, batch_dim.size,
                        num_microbatches, num_microbatches, batch_dim.size))


def _microbatches(x, batch_dim, num_microbatches):
  """x [batch, rest...] -> [batch/M, microbatches, rest...]; microbatch m
  holds rows m, M + m, ... (strided: a split batch stays on its
  processors)."""
  small = mtf.Dimension(batch_dim.name, batch_dim.size // num_microbatches)
  micro = mtf.Dimension(MICROBATCH_DIM_NAME, num_microbatches)
  rest = [d for d in x.shape.dims if d.name != batch_dim.name]
  if x.shape.dims[0].name != batch_dim.name:
    x = mtf.transpose(x, [batch_dim] + rest)
  return mtf.reshape(x, [small, micro] + rest)


def _slot(t, stage, schedule):
  """(microbatch, repeat, busy) that `stage` (an int Tensor) works on at
  iteration t (an int scalar Tensor), as Schedule.slot computes it, in
  meshtf ops; repeat is 0 and busy false in the bubble."""
  s, r, m = (schedule.stages, schedule.circular_repeats,
             schedule.num_microbatches)
  k = t - stage
  started = mtf.greater_equal(k, 0)
  k = mtf.maximum(k, 0)
  j, k = mtf.mod(k, s), mtf.floordiv(k, s)
  repeat, block = mtf.mod(k, r), mtf.floordiv(k, r)
  microbatch = block * s + j
  busy = mtf.logical_and(started, mtf.less(microbatch, m))
  repeat = mtf.where(busy, repeat, 0)
  return mtf.where(busy, microbatch, 0), repeat, busy


def pipeline(stage_fn, x, stages, num_microbatches, circular_repeats=1,
             carried=None, batch_dim=None, original_name=None):
  """Runs stage_fn as a pipeline of `stages` stages over num_microbatches
  microbatches of x (GSPMD's vectorised pipelining; see the module
  docstring). Returns what applying all S*R chunks in order to x gives.

  The iterations are one mtf.while_loop (the program does not grow with
  M): each shifts the buffers one stage, feeds stage 0 its microbatch
  (a gather by the iteration number), runs stage_fn, and adds the last
  stage's finished microbatch to the output (a loop accumulator). Its
  gradient is a backward loop over the iterations that re-runs each
  iteration's stage_fn from the buffers recorded for it (GPipe's
  rematerialization: the buffers are what the pipeline keeps per
  iteration) and sums the stacked weights' gradients over the
  iterations, reduced once after the loop.

  Args:
    stage_fn: fn(h, carried) -> h' with h: [stage, batch/M, rest...] and
      carried: {name: [stage, batch/M, ...]} (per-example side inputs that
      travel with their microbatch, e.g. sequence ids) plus
      carried[ITERATION] the iteration number (int32 scalar: e.g. to draw
      dropout per microbatch). Variables it makes with get_variable are
      stacked along stage (and stage_repeat).
    x: [batch, rest...] (batch_dim, default x's first dim).
    stages, num_microbatches, circular_repeats: S, M, R.
    carried: {name: Tensor with batch_dim} or None.
    original_name: fn(name, chunk) -> the variable name whose initial
      value the stacked variable takes at chunk r*S + s (see
      StackedInitializer); default "<name>/chunk_<c>".

  Lay out `stage` over a mesh axis of size S ("stage:pipe") to put each
  stage on its own processors: the shift becomes a collective permute.

  Example:
    >>> y = pipeline(stage_fn, x, stages=4, num_microbatches=8,
    ...              circular_repeats=2)
  """
  schedule = Schedule(stages, num_microbatches, circular_repeats)
  name = x.shape.dims[0].name if batch_dim is None else getattr(
      batch_dim, "name", batch_dim)
  found = [d for d in x.shape.dims if d.name == name]
  if not found:
    raise ValueError("pipeline: x %s has no batch dim %r: pass batch_dim="
                     "the name of the dim to split into microbatches" % (
                         x.shape, name))
  batch_dim = found[0]
  check_batch(batch_dim, num_microbatches)
  carried = dict(carried or {})
  if ITERATION in carried:
    raise ValueError("pipeline: carried may not use the name %r (the "
                     "iteration number's)" % ITERATION)
  mesh = x.mesh
  s_count, r_count = stages, circular_repeats
  stage_dim = mtf.Dimension(STAGE_DIM_NAME, s_count)
  repeat_dim = (mtf.Dimension(REPEAT_DIM_NAME, r_count) if r_count > 1
                else None)
  micro_dim = mtf.Dimension(MICROBATCH_DIM_NAME, num_microbatches)
  names = [""] + sorted(carried)
  stacks = [_microbatches(t, batch_dim, num_microbatches)
            for t in [x] + [carried[n] for n in names[1:]]]
  buffers = [mtf.zeros(mesh, mtf.Shape(
      [stage_dim] + [d for d in t.shape.dims if d != micro_dim]),
                       dtype=t.dtype) for t in stacks]
  original_name = original_name or _default_original_name
  iterations = schedule.num_iterations

  def cond(t, *unused):
    del unused
    return mtf.less(t, iterations)

  def body(t, *bufs):
    stage_ids = mtf.range(mesh, stage_dim, tf.int32)
    fresh, first_repeat, busy = _slot(t, 0, schedule)
    take = mtf.logical_and(mtf.logical_and(mtf.equal(stage_ids, 0), busy),
                           mtf.equal(first_repeat, 0))
    bufs = [mtf.where(take, mtf.gather(stack, fresh, micro_dim),
                      mtf.shift(buf, 1, stage_dim, wrap=r_count > 1),
                      output_shape=buf.shape)
            for stack, buf in zip(stacks, bufs)]
    selection = None
    if repeat_dim is not None:
      _, repeat, _ = _slot(t, stage_ids, schedule)
      selection = mtf.one_hot(repeat, repeat_dim, dtype=tf.float32)
    select = _select_by(selection, [stage_dim])
    getter = _StackedGetter(stage_dim, repeat_dim,
                            lambda name, select=select: (name, select),
                            original_name)
    side = dict(zip(names[1:], bufs[1:]))
    side[ITERATION] = t
    with variables.custom_getter(getter):
      h = stage_fn(bufs[0], side)
    if h.shape != bufs[0].shape:
      raise ValueError("pipeline: stage_fn returned %s; it must keep its "
                       "input's shape %s" % (h.shape, bufs[0].shape))
    # The last stage's finished microbatch (zeros elsewhere), at its place
    # along microbatches: summed over the iterations by the loop.
    done, last_repeat, busy = _slot(t, s_count - 1, schedule)
    finished = mtf.logical_and(
        mtf.logical_and(mtf.equal(stage_ids, s_count - 1), busy),
        mtf.equal(last_repeat, r_count - 1))
    at = mtf.one_hot(done, micro_dim, dtype=h.dtype)
    out = mtf.multiply(mtf.where(finished, h, mtf.zeros_like(h)), at,
                       output_shape=mtf.Shape(h.shape.dims[:2] + [micro_dim] +
                                              h.shape.dims[2:]))
    return [t + 1, h] + bufs[1:] + [out]

  outs = control.while_loop(
      cond, body, [mtf.constant(mesh, 0, dtype=tf.int32)] + buffers,
      has_accumulators=True, maximum_iterations=iterations,
      name="pipeline")
  # One sum over stage (an allreduce over its axis): only the last stage's
  # slots hold microbatches.
  out = mtf.reduce_sum(outs[-1], reduced_dim=stage_dim)
  rest = [d for d in x.shape.dims if d.name != batch_dim.name]
  out = mtf.reshape(out, [batch_dim] + rest)
  if out.shape != x.shape:
    out = mtf.transpose(out, x.shape)
  return out


# --- a Transformer LayerStack, pipelined ---------------------------------------
class LayerPipeline(object):
  """How a LayerStack runs its layers as a pipeline: the stack's L layers
  form S*R equal chunks of L/(S*R) layers (chunk c = r*S + s on stage s);
  the stacked variable of chunk position k, "<scope>/pipeline/layer_<k>/...",
  starts at [s, r] as the unpipelined "<scope>/layer_<c*K+k>/..." would.
  Decoding modes ("first_part", "incremental") run the layers one after
  the other on their part of the stacked weights.

  Example:
    >>> stack = transformer.make_layer_stack(4, 2, 4, 16, pipeline_stages=2,
    ...                                      num_microbatches=4)
    >>> stack.pipeline.schedule.num_iterations
    5
  """

  def __init__(self, stages, num_microbatches=1, circular_repeats=1):
    self.schedule = Schedule(stages, num_microbatches, circular_repeats)
    self.stages, self.num_microbatches = stages, num_microbatches
    self.circular_repeats = circular_repeats

  @property
  def chunks(self):
    return self.stages * self.circular_repeats

  def check_layers(self, layers_list):
    """Raises ValueError (one line, with the fix) unless the layers split
    into `chunks` chunks holding the same kinds of layers."""
    n, c = len(layers_list), self.chunks
    if n % c:
      raise ValueError(
          "LayerStack: %d layers do not split into pipeline_stages * "
          "circular_repeats = %d * %d = %d equal chunks: use a multiple of "
          "%d layers, or fewer stages / repeats" % (
              n, self.stages, self.circular_repeats, c, c))
    k = n // c
    kinds = [_layer_kind(l) for l in layers_list]
    for i in range(k, n):
      if kinds[i] != kinds[i % k]:
        raise ValueError(
            "LayerStack: pipelined stages must hold the same layers, but "
            "layer %d is %s and layer %d (the same place in the first chunk"
            " of %d) is %s: use num_layers that chunks into equal blocks"
            % (i, kinds[i][0], i % k, k, kinds[i % k][0]))

  def call_layers(self, stack, context, x):
    """x [batch, length, d_model] through the stack's layers (not its
    input dropout or final norm), pipelined."""
    if context.mode in ("first_part", "incremental"):
      return self._sequential(stack, context, x)
    if context.encoder_output is not None:
      raise ValueError("LayerStack at %s: pipelining a stack that attends to"
                       " an encoder output is not supported; set "
                       "pipeline_stages=1 for it" % context.scope)
    if x.shape.ndims != 3:
      raise ValueError("LayerStack at %s: a pipelined stack takes "
                       "[batch, length, d_model], got %s" % (context.scope,
                                                             x.shape))
    base, layers_list = context.scope, stack.layers
    k_count = len(layers_list) // self.chunks
    prefix = base + "/pipeline/layer_"

    iterations = self.schedule.num_iterations

    def stage_fn(h, carried):
      ctx = copy.copy(context)
      ctx.cache = {}
      ctx.batch_dims = list(h.shape.dims[:-2])
      ctx.sequence_id = carried.get("sequence_id")
      # Dropout drawn anew for every iteration (so every microbatch) and
      # every step: the loop body's ops are the same in each iteration.
      it = carried[ITERATION]
      ctx.step = it if context.step is None else (
          context.step * iterations + mtf.cast(it, context.step.dtype))
      losses = len(context.losses) if context.losses is not None else 0
      for k in range(k_count):
        layer = layers_list[k]
        h = stack.residual_block(ctx, h, k, layer, "%s%03d/%s" % (
            prefix, k, layer.name))
      if context.losses is not None and len(context.losses) != losses:
        raise ValueError("LayerStack at %s: a layer added a loss (an MoE "
                         "layer?); layers with extra losses cannot be "
                         "pipelined: set pipeline_stages=1" % base)
      return h

    def original_name(name, chunk):
      if not name.startswith(prefix):
        return _default_original_name(name, chunk)
      k, rest = int(name[len(prefix):len(prefix) + 3]), name[len(prefix) + 3:]
      return "%s/layer_%03d%s" % (base, chunk * k_count + k, rest)

    carried = ({} if context.sequence_id is None
               else {"sequence_id": context.sequence_id})
    return pipeline(stage_fn, x, self.stages, self.num_microbatches,
                    self.circular_repeats, carried, x.shape.dims[0],
                    original_name)

  def _sequential(self, stack, context, x):
    """The layers in order, layer c*K + k reading part [s, r] of its
    stacked variables (a decoder's steps need no microbatches)."""
    base, layers_list = context.scope, stack.layers
    k_count = len(layers_list) // self.chunks
    stage_dim = mtf.Dimension(STAGE_DIM_NAME, self.stages)
    repeat_dim = (mtf.Dimension(REPEAT_DIM_NAME, self.circular_repeats)
                  if self.circular_repeats > 1 else None)
    lead = mtf.Shape([stage_dim] + ([repeat_dim] if repeat_dim else []))
    layer_prefix = base + "/layer_"

    def stacked_name(name):
      if not name.startswith(layer_prefix):
        return None
      i = int(name[len(layer_prefix):len(layer_prefix) + 3])
      rest = name[len(layer_prefix) + 3:]
      chunk, k = divmod(i, k_count)
      onehot = np.zeros(lead.to_integer_list, np.float32)
      onehot[(chunk % self.stages,) + ((chunk // self.stages,)
                                       if repeat_dim else ())] = 1.0
      select = _select_by(mtf.constant(x.mesh, onehot, lead))
      return "%s/pipeline/layer_%03d%s" % (base, k, rest), select

    def original_name(name, chunk):
      k = int(name[len(base + "/pipeline/layer_"):][:3])
      rest = name[len(base + "/pipeline/layer_") + 3:]
      return "%s/layer_%03d%s" % (base, chunk * k_count + k, rest)

    getter = _StackedGetter(stage_dim, repeat_dim, stacked_name,
                            original_name)
    with variables.custom_getter(getter):
      for i, layer in enumerate(layers_list):
        x = stack.residual_block(context, x, i, layer, "%s%03d/%s" % (
            layer_prefix, i, layer.name))
    return x


def _layer_kind(layer):
  """(class name, hyperparameters): layers of one kind make variables of
  the same shapes and compute the same function of them."""
  params = sorted((k, repr(v)) for k, v in vars(layer).items())
  return type(layer).__name__, tuple(params)


__all__ = ["LayerPipeline", "Schedule", "bubble_fraction", "StackedInitializer", "pipeline",
           "check_batch", "STAGE_DIM_NAME", "REPEAT_DIM_NAME",
           "MICROBATCH_DIM_NAME"]
