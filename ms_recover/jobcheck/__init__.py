"""Validating AscendJob manifests before submission (``ms-recover check-job``).

- :mod:`~ms_recover.jobcheck.check`: reading files, the command line, findings and reports;
- :mod:`~ms_recover.jobcheck.yamlread`: a bounded, strict YAML reader (no alias bombs, no
  unbounded files, Kubernetes' duplicate-key rule);
- :mod:`~ms_recover.jobcheck.schema`: the AscendJob CRD's OpenAPI schema, as the API server
  checks it;
- :mod:`~ms_recover.jobcheck.rules`: ms_recover's own rules on top of the schema.
"""
