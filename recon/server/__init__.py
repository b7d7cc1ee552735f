"""The server room: an OpenAI-compatible server over the local model, and a client for any such
server.

* :mod:`~recon.server.serve` — ``recon serve``: ``make_server`` puts the app on a socket (uvicorn);
* :mod:`~recon.server.app` — the FastAPI app: routes, and the checks in front of them;
* :mod:`~recon.server.schemas` — the pydantic request models;
* :mod:`~recon.server.fields` — their strict field validators, the JSON body, OpenAI's error object;
* :mod:`~recon.server.responses` — chat and text completions (and their stream) from samples;
* :mod:`~recon.server.prompt_logprobs` — SGLang's native ``/generate``: prompt logprobs in its shape;
* :mod:`~recon.server.limits` — the limits, the gate before the model, the request deadlines;
* :mod:`~recon.server.protocol` — uvicorn's h11 protocol with the limits it lacks;
* :mod:`~recon.server.client` — ``recon collect``: prompts to a server, responses to records.
"""
