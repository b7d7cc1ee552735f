"""The prompts room: the prompt a server built, before the model sampled a token.

An engine (vLLM, SGLang) turns a chat request into prompt text with the model's own chat template,
rendered by transformers' rules. To know which ids a server prompted with, recon must render the
same template the same way, byte for byte:

* :mod:`~recon.prompts.sandbox` — the jinja2 environment: transformers' options, filters and
  globals, inside recon's limits (the immutable sandbox, a work budget, bounded output);
* :mod:`~recon.prompts.template` — :class:`~recon.prompts.template.ChatTemplate`: what
  ``apply_chat_template`` passes a template and how it prepares the messages;
* :mod:`~recon.prompts.sources` — where templates live (``chat_template.jinja``,
  ``tokenizer_config.json``, a GGUF header, a file given by hand) and the special-token
  variables (``bos_token``, ...) a tokenizer's config gives them;
* :mod:`~recon.prompts.render` — a record's prompt ids: the engine's, else its request rendered
  and encoded as an engine's chat path encodes it;
* :mod:`~recon.prompts.audit` — the engine's prompt against the render: exact, or the first
  divergence with a region and a cause.
"""
