"""The recovery room: the model itself, where text does not round-trip.

* :mod:`~recon.recovery.model` — the local model (SmolLM2 by default, the ``generate`` extra):
  real ground truth by sampling, and log-probabilities for scoring;
* :mod:`~recon.recovery.scorers` — who scores candidate ids: the local model or a server;
* :mod:`~recon.recovery.recover` — the search for the segmentation the model sampled.
"""
