"""The kgrad tab of TensorBoard and the data behind it (also used by ``kgrad report --html``).

- `kgrad.dashboard.events`: every event of a run, read from the event files, cached;
- `kgrad.dashboard.views`: what the tab draws, as compact JSON-ready dicts;
- `kgrad.dashboard.plugin`: the TensorBoard plugin and its HTTP routes;
- ``static/``: the tab's ES modules and CSS (no network, no framework).
"""
