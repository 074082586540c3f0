"""The base of every kubetune API model: camelCase on the wire, strict about unknown fields."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_enum_values=True,
        validate_default=True,
    )

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, without unset optionals."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")
