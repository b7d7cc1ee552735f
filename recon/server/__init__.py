"""The server room: an OpenAI-compatible server over the local model, and a client for any such
server.

* :mod:`~recon.server.serve` — ``recon serve``;
* :mod:`~recon.server.client` — ``recon collect``: prompts to a server, responses to records.
"""
