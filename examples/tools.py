"""Task handlers and tools for the example workflows (loaded with `--tools examples.tools`)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from stevora import StepContext, ToolContext, register_task_handler, register_tool, tool

KNOWLEDGE_BASE = [
    {"id": "kb-1", "title": "Resetting a password", "body": "Use Settings → Security → Reset password."},
    {
        "id": "kb-2",
        "title": "Refund policy",
        "body": "Refunds within 30 days for annual plans, pro rata after.",
    },
    {
        "id": "kb-3",
        "title": "Exporting data",
        "body": "Admins can export all workspace data as JSON from Billing.",
    },
    {"id": "kb-4", "title": "Plan limits", "body": "Team plans allow 50 seats; Enterprise is unlimited."},
]
CUSTOMERS = {
    "cus_42": {
        "customerId": "cus_42",
        "name": "Acme Corp",
        "plan": "team",
        "seats": 48,
        "renewal": "2027-01-31",
    },
}


# -- lead onboarding (task / wait / condition / approval) --------------------------------------


async def enrich_lead(ctx: StepContext, step: Any) -> dict[str, Any]:
    """Pretend to call a CRM: company size decides the enterprise path."""
    email = str(ctx.workflow_input.get("email", "someone@example.com"))
    size = int(ctx.workflow_input.get("companySize", 10))
    lead = {
        "email": email,
        "domain": email.split("@")[-1],
        "company": {"size": size},
        "isEnterprise": size >= 100,
    }
    return {"status": "completed", "output": {"enriched": True}, "stateUpdates": {"enrichedLead": lead}}


async def draft_welcome_email(ctx: StepContext, step: Any) -> dict[str, Any]:
    lead = ctx.workflow_state["enrichedLead"]
    email = {
        "subject": f"Welcome to Stevora, {lead['domain']}",
        "body": f"Hi! Your team of {lead['company']['size']} is set up. A solutions engineer will reach out.",
    }
    return {"status": "completed", "stateUpdates": {"welcomeEmail": email}}


async def send_welcome(ctx: StepContext, step: Any) -> dict[str, Any]:
    # A real handler would send with ctx.idempotency_key as the provider's idempotency key.
    email = ctx.workflow_state.get("welcomeEmail") or {
        "subject": "Welcome!",
        "body": "Here is our self-serve guide.",
    }
    return {
        "status": "completed",
        "output": {"sent": True, "subject": email["subject"]},
        "stateUpdates": {"sentAt": "now", "sentSubject": email["subject"]},
    }


register_task_handler("enrich_lead", enrich_lead)
register_task_handler("draft_welcome_email", draft_welcome_email)
register_task_handler("send_welcome", send_welcome)


# -- research agent (llm step with tools) ------------------------------------------------------


@tool
async def search_knowledge_base(
    query: Annotated[str, Field(description="What to search for")],
    limit: Annotated[int, Field(description="Maximum number of articles")] = 3,
) -> list[dict[str, str]]:
    """Search the help-center knowledge base."""
    words = {w.lower().strip("?.,") for w in query.split() if len(w) > 3}
    scored = sorted(KNOWLEDGE_BASE, key=lambda a: -sum(w in (a["title"] + a["body"]).lower() for w in words))
    return scored[: max(1, int(limit))]


@tool
async def get_customer_data(customerId: str, ctx: ToolContext) -> dict[str, Any]:
    """Look up a customer's plan and seats by id."""
    found = CUSTOMERS.get(customerId) or CUSTOMERS["cus_42"]
    return {**found, "lookedUpWith": ctx.idempotency_key}


# -- support agent: tools offered by name from the registry ------------------------------------

RATES_TO_USD = {"USD": 1.0, "EUR": 1.08, "GBP": 1.27}
CONVERT_CURRENCY_PARAMETERS = {
    "type": "object",
    "properties": {
        "amount": {"type": "number", "description": "The amount to convert"},
        "currency": {"type": "string", "enum": sorted(RATES_TO_USD), "description": "Its currency"},
    },
    "required": ["amount", "currency"],
}


def convert_currency(input: dict[str, Any]) -> dict[str, Any]:
    """Convert an amount to US dollars (a plain input-dict handler, run in a thread)."""
    rate = RATES_TO_USD.get(str(input.get("currency")), 1.0)
    return {"usd": round(float(input.get("amount", 0)) * rate, 2), "rate": rate}


register_tool(
    "convert_currency",
    convert_currency,
    description="Convert an amount to US dollars.",
    parameters=CONVERT_CURRENCY_PARAMETERS,
)


# -- workflows as tools: the child workflows of research-lead.json ----------------------------


async def web_search(ctx: StepContext, step: Any) -> dict[str, Any]:
    """The `web-search` workflow's one step; its input follows the `defaultParams` schema."""
    query = str(ctx.workflow_input.get("query", ""))
    limit = int(ctx.workflow_input.get("max_results", 10))
    hits = [
        {"title": f"{query} — result {i}", "url": f"https://example.com/{i}"} for i in range(1, limit + 1)
    ]
    return {"status": "completed", "stateUpdates": {"results": hits[:3], "total": len(hits)}}


async def lookup_account(ctx: StepContext, step: Any) -> dict[str, Any]:
    """The `account-lookup` workflow's one step; its input follows the `inputSchema`."""
    found = CUSTOMERS.get(str(ctx.workflow_input.get("customerId"))) or CUSTOMERS["cus_42"]
    return {"status": "completed", "stateUpdates": {"account": found}}


register_task_handler("web_search", web_search)
register_task_handler("lookup_account", lookup_account)
