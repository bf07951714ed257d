"""Layout presets: the layout rules the configs, benches and docs use, named
once (as t5x names its standard logical axis rules once).

The standard Transformer layout splits the batch over a data axis and the
heads, the feed-forward hidden dim and the vocabulary over a model axis
(Megatron's model parallelism, Mesh-TensorFlow paper section 5). An MoE
model adds GShard's expert parallelism: its groups and experts over the data
axis, the experts' hidden dim over the model axis. Each preset is a layout
string, on mesh axes "data" and "model" unless others are named.

Example:
  >>> STANDARD
  'batch:data;heads:model;d_ff:model;vocab:model'
  >>> expert_parallel("cores")
  'batch:cores;group:cores;experts:cores'
  >>> standard(moe=True) == MOE_STANDARD
  True
"""


def data_parallel(data="data"):
  """The batch over mesh axis `data`.

  Example:
    >>> data_parallel("all")
    'batch:all'
  """
  return "batch:%s" % data


def model_parallel(model="model"):
  """Heads, d_ff and vocab over mesh axis `model` (no batch rule).

  Example:
    >>> model_parallel()
    'heads:model;d_ff:model;vocab:model'
  """
  return "heads:{m};d_ff:{m};vocab:{m}".format(m=model)


def expert_parallel(data="data"):
  """An MoE model's batch, groups and experts over mesh axis `data`
  (GShard's layout).

  Example:
    >>> expert_parallel()
    'batch:data;group:data;experts:data'
  """
  return "batch:{d};group:{d};experts:{d}".format(d=data)


def standard(data="data", model="model", moe=False):
  """Data parallel over `data` and model parallel over `model`; with moe,
  expert parallel over `data` and the experts' hidden dim over `model`.

  Example:
    >>> standard("rows", "cols")
    'batch:rows;heads:cols;d_ff:cols;vocab:cols'
  """
  if moe:
    return "%s;%s;expert_hidden:%s" % (expert_parallel(data),
                                       model_parallel(model), model)
  return "%s;%s" % (data_parallel(data), model_parallel(model))


DATA_PARALLEL = data_parallel()
STANDARD = standard()
MOE_STANDARD = standard(moe=True)
