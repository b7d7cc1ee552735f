"""The notebook room: what the notebooks show, kept out of the notebooks.

* :mod:`~recon.notebook.report` — parameters, papermill runs into ``reports/``, recorded values;
* :mod:`~recon.notebook.plots` — figures, each drawn from a table a test can check;
* :mod:`~recon.notebook.views` — pure tables and HTML for tokens and samples;
* :mod:`~recon.notebook.widgets` — the ipywidgets layer over the views.
"""
