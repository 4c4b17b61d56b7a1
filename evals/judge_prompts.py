"""The judge prompts, in our own words, each with its source's inputs, reply fields and decision rule.
To put a source's own text in front of the judge, pass it as a file (`--judge-template FILE`): only the
placeholders `{question}`, `{response}` and `{correct_answer}` are filled."""

LABELLED_TEMPLATE = """\
Grade a response to a question against the correct answer given below.

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

Reply with these four labelled lines, in this order:

extracted_final_answer: the final answer the [response] gives, copied as written; None if it gives no \
definite final answer.

reasoning: a short account of whether extracted_final_answer and [correct_answer] differ in any way that \
matters. Judge only whether they match: do not solve the question, discuss its background, or defend an answer \
other than [correct_answer].

correct: yes if extracted_final_answer agrees with [correct_answer], or is within a small margin of error for \
a numerical answer; no otherwise (any inconsistency, ambiguity, non-equivalence, or a wrong extracted answer).

confidence: the confidence between 0% and 100% that the [response] states; 100 if it states none.
"""

BROWSECOMP_ZH_TEMPLATE = """\
请对照下面给出的[correct_answer]，判断[response]对[question]的回答是否正确。

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

请按以下四行格式作答，顺序不变：

extracted_final_answer: 照原文摘录[response]给出的最终答案；若[response]没有明确的最终答案，写 None。

reasoning: 简要说明 extracted_final_answer 与 [correct_answer] 之间有无实质差异。只判断两者是否一致：不要解题，\
不要讨论题目背景，也不要为[correct_answer]以外的答案辩护。

correct: extracted_final_answer 与 [correct_answer] 一致（数值题允许很小的误差）时写 yes；否则（有任何不一致、歧义、\
不等价，或摘录的答案有误）写 no。

confidence: [response]中给出的置信度，介于 0% 到 100% 之间；若没有给出，写 100%。
"""

XBENCH_TEMPLATE = """\
请根据下面的[正确答案]，判断[回答]对[原问题]的作答是否正确。

[原问题]: {question}

[正确答案]: {correct_answer}

[回答]: {response}

请按以下格式给出判断：

最终答案: 摘录[回答]中的最终答案；若[回答]没有明确的最终答案，写 无。

解释: 对照[正确答案]，说明[最终答案]为何正确或错误。只看[最终答案]与[正确答案]有无实质差异：不要评论题目背景，\
不要重新解题，也不要为不同于[正确答案]的答案辩护。

结论: [最终答案]与[正确答案]一致，或数值题在可接受的小误差之内时，写 正确；否则（有任何不一致、歧义、不等价，\
或摘录的答案有误）写 错误。
"""

EQUIVALENT_TEMPLATE = """\
Decide whether the predicted answer to the question below means the same as the labeled answer.

Question: {question}

Labeled answer: {correct_answer}

Predicted answer: {response}

Is the predicted answer equivalent to the labeled answer? Reply with the single word "Correct" if it is, \
or "Incorrect" if it is not, and nothing else.
"""


JSON_TEMPLATE = """\
Grade a response to a question against the correct answer given below.

[question]: {question}

[response]: {response}

[correct_answer]: {correct_answer}

Give four things: extracted_final_answer, the final answer the [response] gives, copied as written (None if it \
gives no definite final answer); reasoning, a short account of whether extracted_final_answer and \
[correct_answer] differ in any way that matters, judging only whether they match (do not solve the question, \
discuss its background, or defend an answer other than [correct_answer]); correct, yes if extracted_final_answer \
agrees with [correct_answer] or is within a small margin of error for a numerical answer, no otherwise (any \
inconsistency, ambiguity, non-equivalence, or a wrong extracted answer); confidence, the confidence between 0 and \
100 that the [response] states, 100 if it states none.
"""

CHOICE_TEMPLATE = """\
Judge whether a predicted answer to a question is right, given the standard answer.

Right (A): the prediction contains the standard answer's essential information, in any language, wording, case \
or order, and says nothing that contradicts it; hedging is fine as long as that holds. Where the standard answer \
names several aspects, all of them must be there; where it gives alternative forms of one answer, any one will do. \
A number must agree with the standard answer to the precision the standard answer gives. Information the question \
already makes obvious may be left out, and a name in another transliteration counts.

Wrong (B): the prediction contradicts the standard answer, is empty, restates the question, lists several \
candidate answers, or avoids giving the answer. Judge only the match with the standard answer, not whether the \
standard answer is itself right.

Question: {question}
Standard answer: {correct_answer}
Predicted answer: {response}

Reply with the single letter A (right) or B (wrong), nothing else.
"""

CHOICE_TEMPLATE_ZH = """\
请根据标准答案，判断模型对问题的预测答案是否正确。

正确（A）：预测答案包含标准答案的关键信息（语言、措辞、大小写、顺序均不重要），且没有与之矛盾的内容；有所保留或推测也可以，\
只要满足前述条件。标准答案涉及多个方面时，必须全部答出；同一方面给出的多种说法，答出其一即可。数值须与标准答案给出的精度一致。\
问题中显而易见的信息可以省略，人名的不同译法视为一致。

错误（B）：预测答案与标准答案矛盾、为空、重复问题、列出多个候选答案，或回避作答。只判断与标准答案是否一致，不评判标准答案本身是否正确。

问题：{question}
标准答案：{correct_answer}
预测答案：{response}

只回复一个字母：A（正确）或 B（错误），不要有其他文字。
"""
