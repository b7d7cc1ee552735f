"""The samples room: the sample format and everything that reads or writes it.

* :mod:`~recon.samples.io` — JSONL lines read safely, every bad line a :class:`RecordError`;
* :mod:`~recon.samples.records` — the format (:class:`Record`, :class:`Response`), parsing and
  validation with file, line and field, streaming reads, duplicate ids;
* :mod:`~recon.samples.seen` — duplicate ids over streams of any length, in flat memory;
* :mod:`~recon.samples.stream` — records written as they are done, and a stopped run resumed;
* :mod:`~recon.samples.importers` — what servers return (SGLang, vLLM, OpenAI/OpenRouter) into
  records, and pairing ground truth with API files;
* :mod:`~recon.samples.export` — training-ready ids out, by policy.
"""
