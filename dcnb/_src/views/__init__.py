"""What a user sees of a session: pictures of its SDFGs (graph, names), what each node costs (overlays, profile),
the generated code (sources), the static HTML (render), the widget, IPython's formatters. Views read the core;
the core never imports them (tests/unit/test_layout.py)."""
