"""The kgrad tab of TensorBoard and the data behind it (also used by ``kgrad report --html``).

- `kgrad.dashboard.events`: every event of a run the tab draws (`kgrad.logs.fast_reader`), cached;
- `kgrad.dashboard.views`: what the tab draws, as compact JSON-ready dicts;
- `kgrad.dashboard.plugin`: the TensorBoard plugin and its HTTP routes;
- `kgrad.dashboard.html_report`: the same views as one HTML file (``kgrad report --html``);
- ``static/``: the tab's ES modules and CSS (no network, no framework).
"""
