"""The rubric contracts of the reference stages, as YAML data (loaded by ContractLibrary)."""
