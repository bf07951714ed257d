"""The levels of the completion: the order in which proposals are enabled.
A proposal travels an edge at the level the edge's kind gives it
(nodes.edge_levels); each level runs to a fixed point before the next starts.

Example:
  >>> from meshtf.layouts.completion import levels
  >>> levels.LEVEL_NAMES[levels.CONTRACTION]
  'contraction'
"""
# Levels, in the order they are enabled.
FIXED, MIRROR, ELEMENTWISE, BROADCAST_BACKWARD, CONTRACTION, WEIGHTS, \
    BROADCAST_FORWARD, DEFAULT = range(8)
LEVEL_NAMES = ("fixed", "mirror", "elementwise", "broadcast (backward)",
               "contraction", "weights", "broadcast (forward)", "default")
PROPAGATION_LEVELS = (ELEMENTWISE, BROADCAST_BACKWARD, CONTRACTION, WEIGHTS,
                      BROADCAST_FORWARD)
