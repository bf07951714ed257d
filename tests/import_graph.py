"""The package's import graph, read from the code: which meshtf module imports
which, counting module-level and function-level (lazy) imports alike.

The facade `meshtf` itself is left out as a target: every `import meshtf as
mtf` would otherwise fold the whole package into one loop, and the facade is
the one place allowed to import everything.

Run it as a script to list the circles (strongly connected components of more
than one module) and the core modules that import the Mesh TensorFlow wing
(of the repository's meshtf/, or of the package directory given):

  python tests/import_graph.py

Example:
  >>> graph = import_graph()
  >>> "meshtf.graph" in graph["meshtf.ops.einsum"]
  True
"""
import ast
import os
import sys

# The Mesh TensorFlow compatibility wing: it imports the core, never the
# reverse. The facade `meshtf/__init__.py` is where the two meet.
COMPAT = "meshtf.compat"


# The package next to this file's directory (the repository's meshtf/).
PACKAGE_DIR = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "meshtf")


def module_files(package_dir=PACKAGE_DIR):
  """{dotted module name: file path} for every .py file under package_dir."""
  mods = {}
  root = os.path.dirname(os.path.abspath(package_dir))
  for dirpath, _, files in os.walk(package_dir):
    for f in sorted(files):
      if f.endswith(".py"):
        path = os.path.join(dirpath, f)
        name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
        if name.endswith(".__init__"):
          name = name[:-len(".__init__")]
        mods[name] = path
  return mods


def _targets(mods, current, node):
  """The meshtf modules one import statement names (the closest existing
  module for `from package import name`)."""
  if isinstance(node, ast.Import):
    names = [a.name for a in node.names]
  else:
    base = node.module or ""
    if node.level:
      is_package = mods[current].endswith("__init__.py")
      pkg = current.split(".") if is_package else current.split(".")[:-1]
      pkg = pkg[:len(pkg) - node.level + 1]
      base = ".".join(pkg + ([base] if base else []))
    names = [base + "." + a.name if base + "." + a.name in mods else base
             for a in node.names]
  for n in names:
    while n and n not in mods:
      n = n.rpartition(".")[0]
    if n and n != current and n != "meshtf":
      yield n


def import_graph(package_dir=PACKAGE_DIR):
  """{module: set of meshtf modules it imports anywhere in its file}."""
  mods = module_files(package_dir)
  graph = {}
  for name, path in mods.items():
    if name == "meshtf":
      continue   # the facade: it may import everything
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    graph[name] = {t for n in ast.walk(tree)
                   if isinstance(n, (ast.Import, ast.ImportFrom))
                   for t in _targets(mods, name, n)}
  return graph


def circles(graph):
  """The import circles: strongly connected components of more than one
  module (Tarjan), each a sorted list, largest first."""
  sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
  index, low, stack, on_stack, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return sorted(out, key=lambda c: (-len(c), c))


def is_compat(module):
  return module == COMPAT or module.startswith(COMPAT + ".")


def core_to_compat(graph):
  """[(core module, compat module it imports)]: the wing must only be
  imported by itself and by the facade."""
  return sorted((m, t) for m, ts in graph.items() if not is_compat(m)
                for t in ts if is_compat(t))


def main():
  graph = import_graph(sys.argv[1] if len(sys.argv) > 1 else PACKAGE_DIR)
  found = circles(graph)
  print(f"{len(graph)} modules, "
        f"{sum(len(t) for t in graph.values())} import edges, "
        f"{len(found)} circles")
  for c in found:
    print(len(c), c)
  leaks = core_to_compat(graph)
  print(f"{len(leaks)} core -> compat imports")
  for m, t in leaks:
    print(" ", m, "->", t)


if __name__ == "__main__":
  main()
