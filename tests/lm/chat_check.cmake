# kiln-lm chat end to end: a tiny Llama pretrained for two iterations with the
# real Llama-2 tokenizer, given a chat template (chat_template.jinja, ending
# each assistant turn with </s>), then a piped conversation: every turn is
# answered, the end of each turn is run ahead after the reply, so the second
# turn runs only its new text (what a fresh conversation with the same text
# runs, less the <s> it starts with), /reset starts afresh, and the turn's end
# token is found from the template.
#   cmake -DLM=kiln-lm -DCORPUS=dir -DTOKENIZER=dir -DWORK=dir -P chat_check.cmake
file(REMOVE_RECURSE ${WORK})
execute_process(COMMAND ${LM} pretrain --data ${CORPUS} --tokenizer ${TOKENIZER} --layers 1
                        --heads 2 --kv-heads 1 --intermediate 32 --hidden 16 --block 16 --batch 4
                        --warmup 1 --eval-windows 8 --threads 1 --iters 2 --eval-interval 2
                        --out ${WORK}/model --cache ${WORK}/corpus.tok
                RESULT_VARIABLE rc OUTPUT_VARIABLE o ERROR_VARIABLE e)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pretrain failed (${rc}):\n${o}\n${e}")
endif()
file(WRITE ${WORK}/model/chat_template.jinja
     "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
     "{% else %} {{ m.content }}</s>{% endif %}{% endfor %}")
file(WRITE ${WORK}/conversation.txt "Hello there\nAnd a second turn\n/reset\nAnd a second turn\n")
execute_process(COMMAND ${LM} chat --model ${WORK}/model --max-tokens 4 --ctx 128 --temperature 0 --threads 1
                INPUT_FILE ${WORK}/conversation.txt
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "chat failed (${rc}):\n${out}\n${err}")
endif()
message(STATUS "chat stderr:\n${err}")
if(NOT err MATCHES "turns end at ids 2\\)")
  message(FATAL_ERROR "the end of turn (</s>, id 2) was not found:\n${err}")
endif()
string(REGEX MATCHALL "prefill [0-9]+ tokens \\([0-9]+ cached\\)" turns "${err}")
list(LENGTH turns n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "expected 3 answered turns, got ${n}:\n${err}")
endif()
list(GET turns 0 t1)
list(GET turns 1 t2)
list(GET turns 2 t3)
if(NOT t1 MATCHES "\\(0 cached\\)" OR NOT t3 MATCHES "\\(0 cached\\)")
  message(FATAL_ERROR "the first turn and the turn after /reset must start afresh: ${turns}")
endif()
if(NOT t2 MATCHES "prefill ([0-9]+) tokens \\(([0-9]+) cached\\)")
  message(FATAL_ERROR "no second turn: ${turns}")
endif()
set(ran2 ${CMAKE_MATCH_1})
set(reused2 ${CMAKE_MATCH_2})
string(REGEX MATCH "prefill ([0-9]+) tokens" m "${t3}")
math(EXPR want "${CMAKE_MATCH_1} - 1")
# Turn 1's prompt is 10 tokens; its reply and </s> follow.
if(NOT ran2 EQUAL want OR reused2 LESS 12)
  message(FATAL_ERROR "the second turn ran ${ran2} tokens (want ${want}: its new text alone) "
                      "and reused ${reused2}:\n${err}")
endif()
string(REGEX MATCHALL "([0-9]+) tokens of the turn's end run ahead" ahead "${err}")
list(GET ahead 0 a1)
if(NOT a1 MATCHES "^[1-9]")
  message(FATAL_ERROR "turn 1's end was not run ahead: ${ahead}")
endif()
