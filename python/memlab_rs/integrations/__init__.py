"""memlab_rs inside other tools, each loaded only by the tool it plugs into (importing this
package imports neither IPython nor pytest nor torch):

- ``ipython``: the ``%mlrun``/``%%mlrun`` magics (``%load_ext memlab_rs``, through
  ``memlab_rs.load_ipython_extension``);
- ``pytest_plugin``: the pytest plugin's measuring side (limit markers, each test's peak),
  which the ``pytest11`` entry point ``pytest_memlab_rs`` registers when asked.
"""
