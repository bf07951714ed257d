"""LayerStack: a Transformer's layers with pre-norm residual connections
and a final norm, as Mesh TensorFlow's `transformer.LayerStack` (meshtf's
Unitransformer and Bitransformer, meshtf/models/transformer.py, hold one
per stack; `transformer.LayerStack` is this class).

Example:
  >>> from meshtf.models import transformer_layers as tl
  >>> stack = LayerStack([tl.SelfAttention(8, 64), tl.DenseReluDense(2048)])
"""
import meshtf as mtf
from meshtf import graph as graph_lib
from meshtf.models import norms
from meshtf.models import remat as remat_lib
from meshtf.models import transformer_layers as tl

NORMS = {"rms_norm": norms.rms_norm, "layer_norm": norms.layer_norm}


class LayerStack(tl.TransformerLayer):
  """Layers with pre-norm residual connections and a final norm.

  layers: TransformerLayer objects or callables fn(x, context) -> y (an
  MoE layer, say; see FunctionLayer). Layer i's variables live under
  "<scope>/layer_%03d/<LayerName>", its norm under ".../<LayerName>/norm".
  pipeline: a pipeline.LayerPipeline to run the layers as a pipeline over
  a "stage" dim (GSPMD 3.3; see meshtf/models/pipeline.py), or None.
  remat: what each residual block keeps for the backward pass while
  training (meshtf/models/remat.py): "none", "full" (its input; the block
  recomputed in its gradient), "einsum_outputs" or
  "weight_einsum_outputs"; a layer's own `remat` attribute, if set,
  overrides it for that layer.

  Example:
    >>> stack = LayerStack([SelfAttention(8, 64), DenseReluDense(2048)] * 6,
    ...                    dropout_rate=0.1, norm_type="layer_norm",
    ...                    remat="full")
  """

  def __init__(self, layers_list=None, dropout_rate=0.0, norm_epsilon=1e-6,
               norm_type="rms_norm", pipeline=None, layers=None,
               remat="none", mask_padding=False):
    # `layers=` is Mesh TensorFlow's keyword for the list.
    if (layers_list is None) == (layers is None):
      raise ValueError("LayerStack: pass the layer list once, as the first "
                       "argument or as layers=")
    if layers_list is None:
      layers_list = layers
    self._layers = [l if isinstance(l, tl.TransformerLayer)
                    else tl.FunctionLayer(l) for l in layers_list]
    if norm_type not in NORMS:
      raise ValueError("LayerStack: norm_type %r is not one of %s" % (
          norm_type, sorted(NORMS)))
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon
    self._norm_type = norm_type
    if pipeline is not None:
      pipeline.check_layers(self._layers)
    self.pipeline = pipeline
    self.remat = remat_lib.check_policy(remat, "LayerStack: remat")
    # Mesh TF's sublayer_mask_padding (T5): zero the padding positions
    # (sequence id 0) of each layer's input and of the stack's output.
    self.mask_padding = mask_padding

  @property
  def layers(self):
    return list(self._layers)

  @property
  def num_layers(self):
    return len(self._layers)

  def _norm(self, x, context, name):
    return NORMS[self._norm_type](x, context.model_dim,
                                  epsilon=self._norm_epsilon, name=name)

  def _mask_padding(self, x, context):
    if not self.mask_padding or context.sequence_id is None or (
        context.incremental):
      return x
    return x * mtf.cast(mtf.not_equal(context.sequence_id, 0), x.dtype)

  def residual_block(self, context, x, index, layer, scope):
    """x + dropout(layer(norm(x))), the layer's variables under scope.

    Example:
      >>> x = stack.residual_block(context, x, 0, stack.layers[0],
      ...                          "decoder/layer_000/SelfAttention")
    """
    context.layer_index = index
    context.scope = scope
    x = tl.annotate(context, x)   # the residual stream (GSPMD's BSM)

    def block(x):
      y = layer.call(context, self._mask_padding(
          self._norm(x, context, scope + "/norm"), context))
      if not isinstance(y, graph_lib.Tensor) or y.shape != x.shape:
        raise ValueError("LayerStack: layer %s returned %s; it must return "
                         "a Tensor of shape %s" % (
                             scope, getattr(y, "shape", y), x.shape))
      return tl.dropout(y, context, self._dropout_rate,
                        name=scope + "/residual_dropout")
    policy = getattr(layer, "remat", None) or self.remat
    if context.train and policy != "none":
      return x + remat_lib.recompute_block(block, x, context, layer, policy)
    return x + block(x)

  def call(self, context, x):
    base = context.scope
    rate = self._dropout_rate
    x = tl.dropout(x, context, rate, name=base + "/input_dropout")
    for i, layer in enumerate(self._layers):
      layer.before_stack(context, "%s/layer_%03d/%s" % (base, i, layer.name))
    context.scope = base
    if self.pipeline is not None:
      x = self.pipeline.call_layers(self, context, x)
    else:
      for i, layer in enumerate(self._layers):
        x = self.residual_block(context, x, i, layer, "%s/layer_%03d/%s" % (
            base, i, layer.name))
    context.scope = base
    x = self._norm(tl.annotate(context, x), context, base + "/final_norm")
    return self._mask_padding(
        tl.dropout(x, context, rate, name=base + "/final_dropout"), context)


__all__ = ["LayerStack", "NORMS"]
