"""Sharding completion (GSPMD section 3.5): the layout of every operation of
a graph, forward and backward alike, from a few annotations, pure Python.

Named dims are the factors. Shardy (OpenXLA's successor to GSPMD's
propagation) rewrites every operation as factors -- "this input dim and
that output dim are one index space" -- and propagates a sharding per
factor. A meshtf graph already is that: a dim name means the same index
space in every tensor of an operation (an einsum's signature, a
reduction's kept dims, a broadcast's shared dims), so a layout is one map
dim name -> mesh axes per operation (its computation layout), and
propagating is copying an entry of that map along a tensor from the
operation that makes it to one that reads it, or back. Only reshapes name
one factor twice (length -> memory_length); they declare the pairs
(Operation.layout_factors). Nothing else needs op-by-op rules: which dims
an operation contracts is which names its output lacks.

The pass, per dim of each operation:

  fixed     annotations (mtf.shard, mtf.replicate: the dims they do not
            name are whole), variable layouts (get_variable(layout=),
            MeshLayout variable_rules), and, under the rules, operations
            inside control flow and imported host data; an operation with
            a layout_source takes that tensor's layout
  mirror    a backward operation lowers under the layout of the forward
            operation whose gradient rule made it (so Figure 7's backward
            gathers and reduce-scatters what the forward did); the sum of
            a gradient's parts takes its parts' common layout, else the
            layout of the tensor it is the gradient of
  then, to a fixed point at each level before the next starts:
  1 elementwise  an input with the output's dims <-> the output
  2 broadcast    the output -> an input with fewer dims (backward)
  3 contraction  einsums, reductions, reshapes, gathers, every other op,
                 both ways
  4 weights      a variable's stored layout through such an operation
                 (the activations decide a computation first: a weight
                 stored split over the data axis is gathered, not summed)
  5 broadcast    an input with fewer dims -> the output (forward)
  default   in graph order: a dim an input holds whole by annotation stays
            whole (mtf.replicate propagates forward), else the rule, else
            whole (its axis is taken: the conflict is recorded)

A layout is only refined: a dim without axes takes them, a dim on x may
become x+y, never anything else; a proposal whose axes another dim of the
operation holds (one tensor, or all of an einsum's dims) is dropped --
that is how dims on different axes merge (GSPMD Figure 3) and how a
conflict becomes a relayout the lowering plans. Within a level the
operations are visited in graph order (a changed one revisits its
neighbours), and at each visit proposals come from the inputs (activations
before variables) before the readers: deterministic. Every entry records
its Origin -- the annotation, variable layout or rule it came from and the
operations it travelled through -- so that each collective can say why it
exists (MeshLayout.assign's GraphLayout.origins).

A graph without annotations and variable rules never gets here
(assignment.py keeps the rules' layout for every operation); run through
this pass it would get exactly the rules, too.

  engine.py       complete(): the pass, and its result (Completion)
  nodes.py        one Node per operation, one Edge per tensor read
  levels.py       the levels, in the order they are enabled
  propagation.py  the propagation levels, to a fixed point each
  defaults.py     the default level, and the sums of gradients' parts
  origins.py      Origin: where each entry came from

Example:
  >>> layout = MeshLayout("x:2;y:4", "")
  >>> result = complete(layout, graph.operations, fixed)
  >>> result.values(h_op)          # h = relu(einsum(shard(x), w_in))
  {'batch': ('x',), 'd_ff': ('y',), 'd_model': ()}
"""
from meshtf.layouts.completion.engine import Completion
from meshtf.layouts.completion.engine import complete
from meshtf.layouts.completion.levels import LEVEL_NAMES
from meshtf.layouts.completion.origins import ANNOTATION
from meshtf.layouts.completion.origins import CONFLICT
from meshtf.layouts.completion.origins import Origin
from meshtf.layouts.completion.origins import OriginKind
from meshtf.layouts.completion.origins import RULES
from meshtf.layouts.completion.origins import VARIABLE
from meshtf.layouts.completion.origins import rule_origin
