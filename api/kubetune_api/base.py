"""The base of every kubetune API model: camelCase on the wire, strict about unknown fields."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        """A field given as null is a field left out, as the API server has it: a null on a field
        without a default is kept (``nullable``, :mod:`kubetune_api.schema`) and reads as absent to
        every CEL rule, and one on a field with a default, or a required one, is dropped before
        defaulting and validation. So ``budget: null`` is no budget, ``storage: null`` the default
        storage, ``model: null`` a missing model, here as there."""
        if isinstance(data, dict) and any(v is None for v in data.values()):
            return {k: v for k, v in data.items() if v is not None}
        return data

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, without unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
