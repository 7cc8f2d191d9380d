"""The tokenizers and chat templates of the model families people download
(Llama 3, Qwen 2.5 / Qwen3, Gemma 2 / 3, Phi-3, Mistral 7B v0.3, Mistral
Nemo's tekken) against Hugging Face transformers built from the same GGUF file.

Each family gets a small GGUF written with PyPI's `gguf` (the
tokenizer.ggml.* keys as llama.cpp's converter writes them) holding a
vocabulary trained here with HF `tokenizers`' BPE trainer plus the family's
special tokens. transformers reads that file
(`AutoTokenizer.from_pretrained(dir, gguf_file=name)`) and pagedattn reads it
(`pagedattn.load_gguf_tokenizer`); encode and decode must agree on prose,
code, numbers, CJK, emoji and whitespace runs, with and without special
tokens. The chat templates are the real models' template texts, rendered by
transformers' Jinja (`apply_chat_template`) and by pagedattn.ChatTemplate.
Nothing is downloaded."""

import json
import random

import pytest

tokenizers = pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("jinja2")
transformers = pytest.importorskip("transformers")
# transformers' GGUF reader imports torch (it reads no tensors here).
pytest.importorskip("torch")

from tokenizers import Regex, models, normalizers, pre_tokenizers, trainers  # noqa: E402
from tokenizers import Tokenizer as HfTokenizer  # noqa: E402

import pagedattn  # noqa: E402
from pagedattn._core import load_gguf_chat_template, load_gguf_tokenizer  # noqa: E402

from test_tokenizer import FRAGMENTS, generated_strings  # noqa: E402

SPACE = "\u2581"
NUM_STRINGS = 1500

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# --- the real chat templates (tokenizer_config.json's chat_template) -------------

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

LLAMA31_TEMPLATE = """{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\\n\\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

QWEN3_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
    "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
    "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ "
    "'<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")

GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\\n'}}
{%- endif -%}
"""

PHI3_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
    "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")

# Phi-3-mini's first template (the assistant header comes with each user turn).
PHI3_FIRST_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
    "{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}"
    "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}"
    "{% endif %}{% endfor %}")

MISTRAL_V3_TEMPLATE = """{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
"""

# Mistral Nemo's (v3-tekken): no spaces around [INST], the assistant's text as is.
MISTRAL_TEKKEN_TEMPLATE = (MISTRAL_V3_TEMPLATE.replace('"[INST] "', '"[INST]"')
                           .replace('"[AVAILABLE_TOOLS] ["', '"[AVAILABLE_TOOLS]["')
                           .replace('" " + message["content"]|trim + eos_token',
                                    'message["content"] + eos_token'))

# Mistral Large 2411 ("v7").
MISTRAL_V7_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
    "message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' "
    "+ message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' "
    "+ message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system and "
    "assistant roles are supported!') }}{% endif %}{% endfor %}")


# --- vocabularies ------------------------------------------------------------------

def corpus(seed, count):
    return generated_strings(seed, count)


def train_byte_level(split_regex, specials, user_defined=(), vocab_size=1400):
    """A byte-level BPE vocabulary (all 256 byte symbols, merges learned on the
    test corpus), with `specials` (control) and `user_defined` at the end, as
    Llama 3 and Qwen place theirs."""
    tok = HfTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split_regex), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(20, 3000), trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    token_type = [1] * len(tokens)
    for t in specials:
        tokens.append(t)
        token_type.append(3)
    for t in user_defined:
        tokens.append(t)
        token_type.append(4)
    return {"tokens": tokens, "token_type": token_type, "merges": merges}


def train_sentencepiece(head, tail=(), whitespace_runs=False, vocab_size=1200):
    """A SentencePiece-style BPE vocabulary as llama.cpp writes one: `head`
    tokens (text, type) first, the 256 <0xXX> byte tokens, the alphabet and
    merged pieces with scores falling in file order, then `tail`. Gemma's
    whitespace-run tokens (user-defined, stored with real spaces) come right
    after the head, as in Gemma's file."""
    trainer_tok = HfTokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="never")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>"],
                                  limit_alphabet=300, show_progress=False)
    trainer_tok.train_from_iterator(corpus(21, 3000), trainer=trainer)
    model = json.loads(trainer_tok.to_str())["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    merged = {a + b for a, b in merges}
    alphabet = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])
                if t != "<unk>" and t not in merged]
    tokens, token_type = [], []
    for text, kind in head:
        tokens.append(text)
        token_type.append(kind)
    if whitespace_runs:
        for n in range(2, 9):
            tokens.append(" " * n)
            token_type.append(4)
        for n in range(2, 4):
            tokens.append("\n" * n)
            token_type.append(4)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    token_type += [6] * 256
    seen = set(tokens) | {text for text, _ in tail}
    pieces = [t for t in alphabet if t not in seen]
    seen.update(pieces)
    for a, b in merges:
        if a + b not in seen and (not whitespace_runs or a + b.strip(SPACE)):
            seen.add(a + b)
            pieces.append(a + b)
    # Merged pieces first (by merge rank), single characters last: SentencePiece's order.
    singles = [p for p in pieces if len(p) == 1]
    pieces = [p for p in pieces if len(p) > 1] + singles
    tokens += pieces
    token_type += [1] * len(pieces)
    for text, kind in tail:
        tokens.append(text)
        token_type.append(kind)
    scores = [0.0 if kind != 1 else -float(i) for i, kind in enumerate(token_type)]
    return {"tokens": tokens, "token_type": token_type, "scores": scores}


def write_gguf(path, arch, name, vocab, model, pre=None, bos=None, eos=None, unk=None, pad=None,
               add_bos=None, add_eos=None, add_space_prefix=None, chat_template=None):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_context_length(512)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["token_type"])
    if "scores" in vocab:
        writer.add_token_scores(vocab["scores"])
    if "merges" in vocab:
        writer.add_token_merges(vocab["merges"])
    index = {t: i for i, t in enumerate(vocab["tokens"])}
    for text, add in ((bos, writer.add_bos_token_id), (eos, writer.add_eos_token_id),
                      (unk, writer.add_unk_token_id), (pad, writer.add_pad_token_id)):
        if text is not None:
            add(index[text])
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if add_eos is not None:
        writer.add_add_eos_token(add_eos)
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>"]
PHI3_TAIL = [("<|endoftext|>", 3), ("<|assistant|>", 3), ("<|placeholder1|>", 3), ("<|end|>", 3),
             ("<|system|>", 3), ("<|user|>", 3)]


def build_family(name, tmp_path_factory):
    """(gguf path, the family's chat templates)."""
    path = tmp_path_factory.mktemp(name) / f"{name}.gguf"
    if name == "llama3":
        v = train_byte_level(LLAMA3_SPLIT, LLAMA3_SPECIALS)
        write_gguf(path, "llama", "Llama 3.1 8B Instruct", v, "gpt2", pre="llama-bpe",
                   bos="<|begin_of_text|>", eos="<|eot_id|>", add_bos=True,
                   chat_template=LLAMA31_TEMPLATE)
        return path, [LLAMA31_TEMPLATE, LLAMA3_TEMPLATE]
    if name in ("qwen2", "qwen3"):
        v = train_byte_level(QWEN2_SPLIT, QWEN_SPECIALS,
                             ["<think>", "</think>"] if name == "qwen3" else [])
        template = QWEN3_TEMPLATE if name == "qwen3" else QWEN25_TEMPLATE
        write_gguf(path, name, "Qwen", v, "gpt2", pre="qwen2", bos="<|endoftext|>",
                   eos="<|im_end|>", pad="<|endoftext|>", add_bos=False, chat_template=template)
        return path, [template]
    if name == "tekken":
        v = train_byte_level(TEKKEN_SPLIT, ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"])
        write_gguf(path, "llama", "Mistral Nemo Instruct 2407", v, "gpt2", pre="tekken",
                   bos="<s>", eos="</s>", unk="<unk>", add_bos=True,
                   chat_template=MISTRAL_TEKKEN_TEMPLATE)
        return path, [MISTRAL_TEKKEN_TEMPLATE]
    if name in ("gemma2", "gemma3"):
        head = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2), ("<mask>", 4),
                ("<start_of_turn>", 3), ("<end_of_turn>", 3)]
        v = train_sentencepiece(head, whitespace_runs=True)
        template = GEMMA3_TEMPLATE if name == "gemma3" else GEMMA2_TEMPLATE
        write_gguf(path, name, "Gemma", v, "llama", bos="<bos>", eos="<eos>", unk="<unk>",
                   pad="<pad>", add_bos=True, add_eos=False, add_space_prefix=False,
                   chat_template=template)
        return path, [template]
    if name == "phi3":
        v = train_sentencepiece([("<unk>", 2), ("<s>", 3), ("</s>", 3)], tail=PHI3_TAIL)
        write_gguf(path, "phi3", "Phi 3 Mini 4k Instruct", v, "llama", bos="<s>",
                   eos="<|endoftext|>", unk="<unk>", pad="<|endoftext|>", add_bos=False,
                   add_eos=False, chat_template=PHI3_TEMPLATE)
        return path, [PHI3_TEMPLATE, PHI3_FIRST_TEMPLATE]
    if name == "mistral":
        head = [("<unk>", 2), ("<s>", 3), ("</s>", 3), ("[INST]", 3), ("[/INST]", 3)]
        v = train_sentencepiece(head)
        write_gguf(path, "llama", "Mistral 7B Instruct v0.3", v, "llama", bos="<s>", eos="</s>",
                   unk="<unk>", add_bos=True, add_eos=False, chat_template=MISTRAL_V3_TEMPLATE)
        return path, [MISTRAL_V3_TEMPLATE, MISTRAL_V7_TEMPLATE]
    raise ValueError(name)


FAMILIES = ["llama3", "qwen2", "qwen3", "tekken", "gemma2", "gemma3", "phi3", "mistral"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    path, templates = build_family(request.param, tmp_path_factory)
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    ours = load_gguf_tokenizer(str(path))
    # The GGUF's own template, as the engine reads it, is recognised.
    assert load_gguf_chat_template(str(path), ours).kind
    return request.param, hf, ours, templates


def family_strings(seed):
    """Prose, code, numbers, CJK, emoji, whitespace runs, special-token text."""
    extra = ["  leading", "a  b   c    d", "x\n\n\ny", "\t\tindent", "   ", "end   ",
             "Hello World HELLO hello", "CamelCaseWord XMLHttpRequest", "path/to/file\n/root",
             "中文 日本語 한국어", "1234567890", "3.14 + 2.71", "<start_of_turn>user\nhi",
             "<|im_start|>x<|im_end|>", "[INST] q [/INST]", "<|user|>\nhi<|end|>\n",
             "<think>\nr\n</think>", "<|begin_of_text|>a<|eot_id|>", "<s> x </s>"]
    return extra + corpus(seed, NUM_STRINGS)


def test_fragments_cover_the_scripts():
    assert any("中" in f for f in FRAGMENTS) and any("🙂" in f for f in FRAGMENTS)


@pytest.mark.parametrize("parse_special", [True, False])
def test_encode_decode_match_transformers(family, parse_special):
    name, hf, ours, _ = family
    # transformers adds GPT2Tokenizer's default "<|endoftext|>" to byte-level
    # vocabularies that lack it, as a token past the model's vocabulary: not
    # part of the model, so strings holding its text are left out. And
    # split_special_tokens leaves BOS/EOS/UNK/PAD whole, so without
    # parse_special strings holding their text are left out too.
    skip = [t for t in hf.get_added_vocab() if ours.token_id(t) < 0]
    if not parse_special:
        skip += [t for t in (hf.bos_token, hf.eos_token, hf.unk_token, hf.pad_token, "<s>", "</s>",
                             "<unk>") if t]
    checked = 0
    mismatches = []
    for text in family_strings(30):
        if any(t in text for t in skip):
            continue
        checked += 1
        if parse_special:
            expected = hf.encode(text, add_special_tokens=False)
        else:
            expected = hf.encode(text, add_special_tokens=False, split_special_tokens=True)
        got = ours.encode(text, add_special=False, parse_special=parse_special)
        if got != expected:
            mismatches.append((text, got, expected))
            continue
        want = hf.decode(expected, skip_special_tokens=False)
        if ours.decode(got).decode("utf-8", "replace") != want:
            mismatches.append((text, ours.decode(got), want))
    assert checked > 1000
    assert not mismatches, (f"{name}: {len(mismatches)} differ, first: "
                            f"{[(t, [hf.convert_ids_to_tokens(i) for i in (g, e) if isinstance(i, list)]) for t, g, e in mismatches[:3]]}"
                            f" {mismatches[:2]}")


def test_special_tokens_added_as_transformers_does(family):
    name, hf, ours, _ = family
    for text in ["Hello world", " leading space", "x"]:
        assert ours.encode(text, add_special=True, parse_special=True) == hf.encode(text), name


# --- chat templates ----------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi there "}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": " 4. "},
     {"role": "user", "content": "And 3+3?\n"}],
    [{"role": "system", "content": "Answer in French."},
     {"role": "user", "content": "Good morning"},
     {"role": "assistant", "content": "Bonjour"},
     {"role": "user", "content": "中文 🙂 and code: `x = 1`"}],
]


def test_chat_templates_match_transformers(family):
    name, hf, ours, templates = family
    bos = hf.bos_token or ""
    eos = hf.eos_token or ""
    for template in templates:
        ours_template = pagedattn.ChatTemplate(template, bos, eos)
        for messages in CONVERSATIONS:
            for generation in (True, False):
                try:
                    expected = hf.apply_chat_template(messages, chat_template=template,
                                                      tokenize=False,
                                                      add_generation_prompt=generation)
                except Exception as error:  # the template raises (Gemma 2's system message)
                    if "TemplateError" not in type(error).__name__:
                        raise
                    with pytest.raises(pagedattn.InvalidArgumentError):
                        ours_template.render(messages, add_generation_prompt=generation)
                    continue
                got = ours_template.render(messages, add_generation_prompt=generation)
                assert got == expected, (name, ours_template.variant, messages, generation)
                # The prompt tokenizes the same way in both.
                assert (ours.encode(got, add_special=False, parse_special=True)
                        == hf.encode(got, add_special_tokens=False)), (name, got)


def test_qwen3_enable_thinking(family):
    name, hf, _, templates = family
    if name != "qwen3":
        pytest.skip("Qwen3 only")
    template = pagedattn.ChatTemplate(templates[0])
    assert template.kind == "qwen3"
    messages = [{"role": "user", "content": "1+1?"},
                {"role": "assistant", "content": "<think>\nadding\n</think>\n\n2"},
                {"role": "user", "content": "2+2?"}]
    for thinking in (None, True, False):
        kwargs = {} if thinking is None else {"enable_thinking": thinking}
        expected = hf.apply_chat_template(messages, chat_template=templates[0], tokenize=False,
                                          add_generation_prompt=True, **kwargs)
        assert template.render(messages, enable_thinking=thinking) == expected
    # A trailing assistant turn (after the last user message) keeps its reasoning.
    tail = messages + [{"role": "assistant", "content": "<think>r</think>4"}]
    assert template.render(tail, add_generation_prompt=False) == hf.apply_chat_template(
        tail, chat_template=templates[0], tokenize=False, add_generation_prompt=False)


def test_llama31_date_string(family):
    name, hf, _, templates = family
    if name != "llama3":
        pytest.skip("Llama 3 only")
    template = pagedattn.ChatTemplate(templates[0], hf.bos_token)
    assert template.variant == "llama3.1"
    messages = CONVERSATIONS[1]
    expected = hf.apply_chat_template(messages, chat_template=templates[0], tokenize=False,
                                      add_generation_prompt=True, date_string="05 Mar 2025")
    assert template.render(messages, date_string="05 Mar 2025") == expected
    assert "Today Date: 26 Jul 2024\n\n" in template.render(messages)


def test_unknown_templates_are_unsupported():
    for text in ["{{ messages }}",
                 "{% for message in messages %}{{'<|im_start|>' + message['role'] + '<|im_sep|>'"
                 " + message['content'] + '<|im_end|>'}}{% endfor %}",
                 "{% for m in messages %}{{ '<|user|>\\n' + m['content'] + eos_token }}{% endfor %}"]:
        with pytest.raises(pagedattn.UnsupportedError, match=r"Template starts: \"\{"):
            pagedattn.ChatTemplate(text)
